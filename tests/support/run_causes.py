"""The second test of ``alerts/tests/runs.yml``: a cause on every rank of a run, and on one rank of another.

The alerts whose traces need no estimator (allocator retries, OOMs counted, fragmentation, a
failing collector, a stalled run), as plain promtool series: run ``shared`` has each cause on every
rank, a minute apart (one cause, seen at slightly different times); run ``one`` on its rank 1 only.
Each run alert fires for ``shared`` no later than its rank alerts, and never for ``one``.
"""

from __future__ import annotations

from tests.support.scenario_defs import expect

SHARED_RUN, ONE_RUN = "shared", "one"
N = 161  # samples: 40 minutes of 15 s scrapes


def _series(name: str, labels: str, values: str) -> str:
    return f"      - series: '{name}{{{labels}}}'\n        values: '{values}'\n"


def _flat(value: str, after: str, at: int) -> str:
    """``value`` until scrape ``at``, then ``after`` (a promtool value expression) to the end."""
    return f"{value}x{at - 1} {after}x{N - at}" if at < N else f"{value}x{N - 1}"


def causes() -> str:
    """Series for runs ``shared`` (every rank has each cause, a minute apart) and ``one`` (rank 1 only)."""
    out = ""
    for run, prefix in ((SHARED_RUN, "s"), (ONE_RUN, "o")):
        for r in range(3):
            hit = run == SHARED_RUN or r == 1
            at = 40 + 4 * r if run == SHARED_RUN else 40  # 10m, 11m, 12m: one cause, seen a minute apart
            rank = f'job="memexporter",instance="{prefix}-0:{9400 + r}",rank="{r}"'
            dev = rank + f',device="cuda:{r}"'
            out += f"      # run {run}, rank {r}{': every cause' if hit else ': healthy'}\n"
            out += _series(
                "memexporter_run_info",
                f'{rank},run_id="{run}",run_id_source="memexporter",detail="per_rank"',
                f"1x{N - 1}",
            )
            # a retry every 2 minutes from 10m; one OOM at 30m (the same batch on every rank)
            out += _series(
                "memexporter_allocator_alloc_retries_total",
                dev,
                "0x" + str(at - 1) + "".join(f" {i}x7" for i in range(1, (N - at) // 8 + 1)) if hit else f"0x{N - 1}",
            )
            out += _series("memexporter_allocator_ooms_total", dev, _flat("0", "1", 120) if hit else f"0x{N - 1}")
            # 40% of the reserved memory in inactive split blocks, 10% of the limit, all along
            out += _series("memexporter_allocator_fragmentation_ratio", dev, f"{0.4 if hit else 0.05}x{N - 1}")
            out += _series("memexporter_allocator_inactive_split_bytes", dev, f"{10e9 if hit else 1e9}x{N - 1}")
            out += _series("memexporter_memory_limit_bytes", dev, f"100e9x{N - 1}")
            # the device collector (NVML) fails from 10m
            out += _series(
                "memexporter_collector_success",
                rank + ',collector="device"',
                _flat("1", "0", at) if hit else f"1x{N - 1}",
            )
            # a step every 15 s, steps stop at 10m (a hung collective), the process stays up
            out += _series(
                "memexporter_last_step_timestamp_seconds",
                rank,
                f"15+15x{at - 1} {at * 15}x{N - at}" if hit else f"15+15x{N - 1}",
            )
            out += _series("memexporter_step_interval_seconds", rank, f"15x{N - 1}")
    return out


def _rank_of(run: str, r: int, severity: str = "warning", device: bool = True) -> dict[str, str]:
    prefix = "s" if run == SHARED_RUN else "o"
    out = {
        "severity": severity,
        "scope": "rank",
        "job": "memexporter",
        "instance": f"{prefix}-0:{9400 + r}",
        "rank": str(r),
        "run_id": run,
    }
    return {**out, "device": f"cuda:{r}"} if device else out


def causes_checks() -> str:
    def who(run: str, r: int) -> str:
        return f"Rank {r} of job memexporter on {'s' if run == SHARED_RUN else 'o'}-0:{9400 + r}"

    shared = "Run shared of job memexporter: 3 of 3 ranks"
    thrash = (
        "The CUDA caching allocator keeps retrying allocations.",
        "The CUDA caching allocator keeps retrying allocations on several ranks of a run.",
    )
    oom = ("A training process ran out of memory.", "Several ranks of a run ran out of memory.")
    frag = ("CUDA memory is highly fragmented.", "CUDA memory is highly fragmented on several ranks of a run.")
    coll = ("A memexporter collector is failing.", "A memexporter collector is failing on several ranks of a run.")
    stall = (
        "A training run has stopped making progress.",
        "A training run has stopped making progress on several ranks.",
    )

    def thrashing(run: str, r: int, times: int = 3) -> tuple[dict[str, str], str, str]:
        return (
            _rank_of(run, r),
            thrash[0],
            f"{who(run, r)} (cuda:{r}) retried cudaMalloc about {times} times in the "
            "last 5m after freeing its cache: steps slow down and an OOM is close.",
        )

    return (
        "    alert_rule_test:\n"
        "      # Thrashing: retries from 10m, 11m and 12m on the ranks of shared. Two ranks from 11m: the run\n"
        "      # alert after its for: of 5m; each rank alert after its 10m. Run one: rank 1 alone, from 10m.\n"
        + expect("MemexporterAllocatorThrashing", "15m")
        + expect(
            "MemexporterAllocatorThrashing",
            "16m",
            [
                (
                    run_labels(SHARED_RUN),
                    thrash[1],
                    f"{shared} keep retrying cudaMalloc after freeing their cache; the most: rank 0 on s-0:9400 (cuda:0), 3 "
                    "retries in the last 5m. Steps slow down and an OOM is close.",
                )
            ],
        )
        + expect(
            "MemexporterAllocatorThrashing",
            "22m",
            [
                thrashing(SHARED_RUN, 0),
                thrashing(SHARED_RUN, 1, 2),
                thrashing(SHARED_RUN, 2),
                thrashing(ONE_RUN, 1),
                (
                    run_labels(SHARED_RUN),
                    thrash[1],
                    f"{shared} keep retrying cudaMalloc after freeing their cache; the most: rank 0 "
                    "on s-0:9400 (cuda:0), 3 retries in the last 5m. Steps slow down and an OOM is close.",
                ),
            ],
        )
        + "      # One OOM on every rank of shared at 30m (no for:): the run alert with the rank alerts.\n"
        + expect("MemexporterOOMOccurred", "29m")
        + expect(
            "MemexporterOOMOccurred",
            "30m",
            [
                (
                    _rank_of(run, r),
                    oom[0],
                    f"{who(run, r)} (cuda:{r}) raised about 1 CUDA out-of-memory error(s) in the last 10m.",
                )
                for run, r in ((SHARED_RUN, 0), (SHARED_RUN, 1), (SHARED_RUN, 2), (ONE_RUN, 1))
            ]
            + [
                (
                    run_labels(SHARED_RUN),
                    oom[1],
                    f"{shared} raised CUDA out-of-memory errors in the last 10m; the most: rank 0 "
                    "on s-0:9400 (cuda:0), about 1.",
                )
            ],
        )
        + "      # Fragmentation all along: the run alert after 10m, the rank alerts after 15m.\n"
        + expect("MemexporterFragmentationHigh", "9m")
        + expect(
            "MemexporterFragmentationHigh",
            "10m",
            [
                (
                    run_labels(SHARED_RUN),
                    frag[1],
                    f"{shared} keep much of the memory their caching allocator reserved in inactive split blocks; the most: "
                    "rank 0 on s-0:9400 (cuda:0), 40% (average over 15m).",
                )
            ],
        )
        + expect(
            "MemexporterFragmentationHigh",
            "15m",
            [
                (
                    _rank_of(run, r),
                    frag[0],
                    f"{who(run, r)} (cuda:{r}): 40% of the memory reserved by the caching allocator "
                    "sits in inactive split blocks (average over 15m).",
                )
                for run, r in ((SHARED_RUN, 0), (SHARED_RUN, 1), (SHARED_RUN, 2), (ONE_RUN, 1))
            ]
            + [
                (
                    run_labels(SHARED_RUN),
                    frag[1],
                    f"{shared} keep much of the memory their caching allocator reserved in inactive "
                    "split blocks; the most: rank 0 on s-0:9400 (cuda:0), 40% (average over 15m).",
                )
            ],
        )
        + "      # NVML fails from 10m, 11m, 12m on shared: under 90% of its last 10m from 11m, 12m, 13m; the run\n"
        "      # alert (one per collector) after 5m, the rank alerts (from 21m) after 10m.\n"
        + expect("MemexporterCollectorFailing", "16m")
        + expect(
            "MemexporterCollectorFailing",
            "17m",
            [
                (
                    {**run_labels(SHARED_RUN), "collector": "device"},
                    coll[1],
                    "Run shared of job memexporter: collector device is failing on 3 of 3 ranks; the worst: rank 0 on "
                    "s-0:9400, 29.27% of scrapes over the last 10m. Its series are missing; the exporter's log names the error "
                    "(one cause for the whole run: a driver, a library, the container's permissions).",
                )
            ],
        )
        + "      # Every rank alert from 23m; run one's rank 1 stays its own: no run alert for one.\n"
        + expect(
            "MemexporterCollectorFailing",
            "23m",
            [
                (
                    {**_rank_of(run, r, device=False), "collector": "device"},
                    coll[0],
                    f"Collector device of rank {r} of job "
                    f"memexporter on {'s' if run == SHARED_RUN else 'o'}-0:{9400 + r} succeeded in only 0% of scrapes over the "
                    "last 10m: its series are missing. The exporter's log names the error.",
                )
                for run, r in ((SHARED_RUN, 0), (SHARED_RUN, 1), (SHARED_RUN, 2), (ONE_RUN, 1))
            ]
            + [
                (
                    {**run_labels(SHARED_RUN), "collector": "device"},
                    coll[1],
                    "Run shared of job memexporter: collector device is "
                    "failing on 3 of 3 ranks; the worst: rank 0 on s-0:9400, 0% of scrapes over the last 10m. Its series are "
                    "missing; the exporter's log names the error (one cause for the whole run: a driver, a library, the "
                    "container's permissions).",
                )
            ],
        )
        + "      # Steps stop at 10m, 11m, 12m on shared (rank 1 of one at 10m): longer than the 15m floor from\n"
        "      # 26m, 27m, 28m; the run alert after 2m30s (at 30m), the rank alerts after 5m (from 31m).\n"
        + expect("MemexporterTrainingStalled", "29m")
        + expect(
            "MemexporterTrainingStalled",
            "30m",
            [
                (
                    run_labels(SHARED_RUN, "critical"),
                    stall[1],
                    f"{shared} have not finished a training step for longer than their rhythm allows, while their processes "
                    "still answer scrapes; the longest: rank 0 on s-0:9400, for 20m 0s. It is probably hung: dump the stacks "
                    "of every rank with py-spy; the rank waiting somewhere else than its peers is the one.",
                )
            ],
        )
        + expect(
            "MemexporterTrainingStalled",
            "33m",
            [
                (
                    _rank_of(run, r, "critical", device=False),
                    stall[0],
                    f"{who(run, r)} has not finished a training step for "
                    f"{since} while its process still answers scrapes: longer than its own rhythm allows (10 x its median step, "
                    "at least 15m, or an open evaluation's or checkpoint's own allowance). It is probably hung (a collective "
                    "waiting for a peer, the data loader, I/O): dump its stacks with py-spy.",
                )
                for run, r, since in (
                    (SHARED_RUN, 0, "23m 0s"),
                    (SHARED_RUN, 1, "22m 0s"),
                    (SHARED_RUN, 2, "21m 0s"),
                    (ONE_RUN, 1, "23m 0s"),
                )
            ]
            + [
                (
                    run_labels(SHARED_RUN, "critical"),
                    stall[1],
                    f"{shared} have not finished a training step for longer than their "
                    "rhythm allows, while their processes still answer scrapes; the longest: rank 0 on s-0:9400, for 23m 0s. "
                    "It is probably hung: dump the stacks of every rank with py-spy; the rank waiting somewhere else than its "
                    "peers is the one.",
                )
            ],
        )
    )


def run_labels(run: str, severity: str = "warning") -> dict[str, str]:
    return {"severity": severity, "scope": "run", "job": "memexporter", "run_id": run}
