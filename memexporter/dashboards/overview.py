"""The Overview dashboard: the run at a glance from the per-run recording rules, then its ranks on request.

The top reads the rules' per-run aggregates (``run_device_kind:...``, ``run:...``, one series per run
and device kind however many ranks it has). The ranks sit in a row collapsed by default, so a
refresh queries none of them until it is opened, and each of its panels shows only the ``$topk``
ranks that matter (the fullest, the slowest...) among those selected, or aggregates them.
"""

from __future__ import annotations

from memexporter.dashboards.grafana import Panel, Row
from memexporter.dashboards.scope import INFO, JOB, KEY, RUN, among, by_kind, m, picked, run_rule, scoped, top, worst

_UTIL = "run_device_kind:memexporter_memory_peak_utilisation"
_PHASE, _LIMIT = "phase_peak_bytes", "memory_limit_bytes"
_RUN = "{{run_id}} {{device_kind}}"
_RI = "[$__rate_interval]"
_WORST = (
    " Shown for the Top K (rank, device) pairs closest to their limit (step peak / limit) among the "
    "selected ranks at the end of the time range."
)
_END = ", at the end of the time range: the same ranks over the whole range."
_FULL = (("green", None), ("orange", 0.8), ("red", 0.9))
_ETA = (("red", None), ("orange", 3600.0), ("green", 86400.0))


def _run() -> list[Panel]:
    """The run, from the per-run recording rules (one series per run and device kind)."""
    return [
        Panel(
            "Ranks answering",
            "stat",
            "short",
            "How many ranks of the run answer their scrape? One memexporter_run_info per rank "
            "(run:memexporter_ranks:count); fewer than the world size means ranks down or not scraped.",
            ((run_rule("run:memexporter_ranks:count"), "{{run_id}}"),),
            w=4,
            h=5,
            instant=True,
            run_wide=True,
        ),
        Panel(
            "Fullest rank",
            "stat",
            "percentunit",
            "Which rank of the run is closest to an OOM, and how close? Its step peak over the level window "
            "as a fraction of its limit, with the rank and device that hold it.",
            ((run_rule(f"{_UTIL}:worst_rank"), "{{run_id}} {{device_kind}}: rank {{rank}} {{device}}"),),
            w=6,
            h=5,
            instant=True,
            thresholds=_FULL,
            run_wide=True,
        ),
        Panel(
            "Lowest time to OOM",
            "stat",
            "s",
            "How long until the first rank of the run reaches its limit at its current leak rate? The lowest "
            "OOM ETA among the run's ranks; Infinity when none grows beyond its own noise.",
            ((run_rule("run_device_kind:memexporter_oom_eta_seconds:min"), _RUN),),
            w=5,
            h=5,
            instant=True,
            thresholds=_ETA,
            run_wide=True,
        ),
        Panel(
            "Fastest leak",
            "stat",
            "binBps",
            "Is memory that persists between steps growing on any rank? The fastest baseline growth among "
            "the run's ranks; 0 while every rank is within its noise.",
            ((run_rule("run_device_kind:memexporter_leak_rate_bytes_per_second:max"), _RUN),),
            w=4,
            h=5,
            instant=True,
            run_wide=True,
        ),
        Panel(
            "Spread between ranks",
            "stat",
            "percentunit",
            "Do the run's ranks peak alike? The highest minus the lowest peak utilisation among its ranks; "
            "in data parallel it stays near 0, and a rank far above the others is what "
            "MemexporterRankImbalance watches.",
            ((run_rule(f"{_UTIL}:spread"), _RUN),),
            w=5,
            h=5,
            instant=True,
            thresholds=(("green", None), ("orange", 0.1), ("red", 0.25)),
            run_wide=True,
        ),
        Panel(
            "Run memory used and limit",
            "timeseries",
            "bytes",
            "How much memory does the whole run use, against what its ranks could hold? The sum of used "
            "and of limit over the run's ranks, per device kind.",
            (
                (run_rule("run_device_kind:memexporter_memory_used_bytes:sum"), f"used {_RUN}"),
                (run_rule("run_device_kind:memexporter_memory_limit_bytes:sum"), f"limit {_RUN}"),
            ),
            run_wide=True,
        ),
        Panel(
            "Peak utilisation: fullest rank and spread",
            "timeseries",
            "percentunit",
            "Is the run getting closer to an OOM, and are its ranks drifting apart? The highest peak "
            "utilisation among the run's ranks, and the spread between the highest and the lowest.",
            ((run_rule(f"{_UTIL}:max"), f"fullest {_RUN}"), (run_rule(f"{_UTIL}:spread"), f"spread {_RUN}")),
            thresholds=_FULL,
            run_wide=True,
        ),
    ]


def _ranks() -> tuple[Panel, ...]:
    """The ranks, bounded: each panel returns at most Top K series (or an aggregate) at any rank count."""
    # A panel of several series per rank picks its Top K ranks once, at the end of the range
    # (picked), and draws each series of those: picked again at each of 720 steps, with a join on
    # run_info each time, one such panel took 3 to 5 s at 1,024 ranks.
    alloc, fullest = "allocator_", worst(pinned=True)
    reserved, rss, nvml = (
        picked(m(name)) for name in (alloc + "reserved_bytes", "host_rss_bytes", "device_used_bytes")
    )
    stale = f"topk($topk, time() - {scoped(m('last_step_timestamp_seconds'))})"
    steps = f"rate({m('steps_total')}{_RI})"
    return (
        Panel(
            "Memory used, limit and step peak",
            "timeseries",
            "bytes",
            "How close is each rank to its OOM limit? used is live memory (cuda: allocated bytes, cpu: RSS), "
            "limit is what used can reach before an OOM, peak the highest used in the last step, baseline "
            "what persists between steps." + _WORST,
            tuple(
                (among(m(f"memory_{name}_bytes"), fullest), f"{label} r{{{{rank}}}} {{{{device}}}}")
                for name, label in (
                    ("used", "used"),
                    ("limit", "limit"),
                    ("peak", "step peak"),
                    ("baseline", "baseline"),
                )
            ),
            w=16,
            h=9,
        ),
        Panel(
            "Time to OOM",
            "stat",
            "s",
            "How long until the step peak reaches the limit at the current leak rate? Infinity means memory "
            "is not growing beyond its own noise. The Top K soonest among the selected ranks.",
            ((f"bottomk($topk, {scoped(m('oom_eta_seconds'))})", "r{{rank}} {{device}}"),),
            w=8,
            h=9,
            instant=True,
            thresholds=_ETA,
        ),
        Panel(
            "Headroom at step peak",
            "bargauge",
            "percentunit",
            "What fraction of the limit is still free at the step peak? 1 - peak / limit, per rank and device: "
            "the Top K with the least among the selected ranks.",
            (
                (
                    f"bottomk($topk, 1 - {scoped(m('memory_peak_bytes'))} / {m('memory_limit_bytes')})",
                    "r{{rank}} {{device}}",
                ),
            ),
            w=8,
            instant=True,
            thresholds=(("red", None), ("orange", 0.1), ("green", 0.25)),
        ),
        Panel(
            "Leak rate",
            "timeseries",
            "binBps",
            "Is the memory that persists between steps growing? Robust slope of the baseline over the leak "
            "window; 0 until enough steps and while within noise. The Top K fastest among the selected ranks" + _END,
            ((top(m("leak_rate_bytes_per_second")), "r{{rank}} {{device}}"),),
            w=8,
        ),
        Panel(
            "Leak per step",
            "timeseries",
            "bytes",
            "How many bytes does the baseline grow per training step? The same slope against the step count; "
            "the Top K among the selected ranks" + _END,
            ((top(m("leak_bytes_per_step")), "r{{rank}} {{device}}"),),
            w=8,
        ),
        Panel(
            "Allocator reserved vs allocated",
            "timeseries",
            "bytes",
            "How much memory does the caching allocator hold beyond live tensors? reserved - allocated is "
            "cache; active includes blocks waiting on streams. The Top K ranks by reserved among those selected, "
            "at the end of the time range; allocated is memory_used_bytes of the accelerator (cuda, xpu or mps: the same figure), "
            "active exists on the detail ranks only from 64 ranks up.",
            (
                (among(m(alloc + "reserved_bytes"), reserved), "reserved r{{rank}} {{device}}"),
                (
                    among(f'memexporter_memory_used_bytes{{{JOB}, device!="cpu"}}', reserved),
                    "allocated r{{rank}} {{device}}",
                ),
                (among(m(alloc + "active_bytes"), reserved), "active r{{rank}} {{device}}"),
            ),
            w=12,
        ),
        Panel(
            "Memory outside the allocator",
            "timeseries",
            "bytes",
            "What does the process hold that PyTorch's caching allocator does not count? Per device, stacked: "
            "the allocator's reserved bytes and, above them, the rest of what the driver counts for this "
            "process (NVML, amdsmi): the CUDA or HIP context, library workspaces, NCCL/RCCL buffers, other libraries. An OOM "
            "with headroom left on the allocator panels is often there. Beside them, the pinned host memory "
            "of the host caching allocator. The Top K ranks closest to their limit at the end of the time "
            "range; absent where the driver cannot see the process (a container's PID namespace).",
            (
                (among(m(alloc + "reserved_bytes"), fullest), "allocator reserved r{{rank}} {{device}}"),
                (among(m("device_non_allocator_bytes"), fullest), "outside the allocator r{{rank}} {{device}}"),
                (among(m("host_pinned_bytes"), fullest, KEY), "pinned host r{{rank}}"),
            ),
            w=12,
            stack=True,
        ),
        Panel(
            "Allocator fragmentation",
            "timeseries",
            "percentunit",
            "How much of the reserved memory is stranded in inactive split blocks? inactive_split / reserved; "
            "high values mean large allocations may fail although memory is free. The Top K selected ranks" + _END,
            ((top(m(alloc + "fragmentation_ratio")), "r{{rank}} {{device}}"),),
            w=12,
            thresholds=(("green", None), ("orange", 0.3), ("red", 0.5)),
        ),
        Panel(
            "Allocator retries and OOMs",
            "timeseries",
            "short",
            "Is the allocator thrashing? Retries are cudaMalloc calls retried after flushing the cache (the "
            "classic pre-OOM signal); OOMs are errors raised. Counted per rate interval, the Top K ranks" + _END,
            tuple(
                (top(f"increase({m(alloc + name)}{_RI})"), f"{label} r{{{{rank}}}} {{{{device}}}}")
                for name, label in (("alloc_retries_total", "retries"), ("ooms_total", "OOMs"))
            ),
            w=12,
        ),
        Panel(
            "Host RSS and DataLoader workers",
            "timeseries",
            "bytes",
            "How much host memory do the training process and its children (DataLoader workers) hold, "
            "against the host or cgroup limit? The Top K selected ranks by RSS at the end of the time range.",
            (
                (among(m("host_rss_bytes"), rss, KEY), "rss r{{rank}}"),
                (among(m("host_children_rss_bytes"), rss, KEY), "children r{{rank}}"),
                (among(m("host_limit_bytes"), rss, KEY), "limit r{{rank}}"),
            ),
            w=12,
        ),
        Panel(
            "Training steps per second",
            "timeseries",
            "ops",
            "Is the job making progress? Rate of steps seen (optimizer steps or memexporter.step()): the Top K "
            "slowest of the selected ranks (in data parallel they all match)" + _END,
            ((top(steps, "bottomk", KEY), "r{{rank}}"),),
            w=8,
        ),
        Panel(
            "GPU memory, all processes (NVML)",
            "timeseries",
            "bytes",
            "Does anything else use this GPU? Device memory used by every process, as nvidia-smi shows it "
            "(NVML v2: without the driver's own reservation), against the device total: the Top K selected "
            "ranks by use at the end of the time range.",
            (
                (among(m("device_used_bytes"), nvml), "used r{{rank}} {{device}}"),
                (among(m("device_total_bytes"), nvml), "total r{{rank}} {{device}}"),
            ),
            w=8,
        ),
        # Failures only (success < 1) are joined to run_info: joining every rank's every collector at
        # each step (10,000 series at 1,024 ranks) took 6 s a refresh. The zeros beside them are a
        # count per collector name, with no join, kept while the selected run has ranks (the ranks'
        # regex is written once per query): a healthy job reads 0, not "No data", which looks like a
        # panel that reads nothing.
        Panel(
            "Collector failures",
            "timeseries",
            "short",
            "Is every collector working? How many of the selected ranks had a collector raise at the last "
            "collection, per collector (its series were dropped from that scrape; the exporter's log has the "
            "error). 0 while every collector works on every rank.",
            (
                (
                    f"count by (collector) ({scoped(m('collector_success') + ' < 1')})"
                    f" or on (collector) (0 * count by (collector) ({m('collector_success')}) and on () count({INFO}{{{RUN}}}))",
                    "{{collector}}",
                ),
            ),
            w=8,
        ),
        Panel(
            "Peak per phase",
            "timeseries",
            "bytes",
            "Which phase of the run needs the most memory? The peak of the last completed occurrence of each "
            "phase (forward, backward and optimizer of a tracked model, and memexporter.phase() names such as "
            "eval or checkpoint), the highest across the selected ranks per device kind, against the lowest "
            "limit. Out-of-step phases (eval, validation, test, predict, checkpoint) are kept out of the step "
            "peak. From 64 ranks up forward, backward and optimizer come from the detail ranks only.",
            # Per device first, then per kind: label_replace runs on a few series, not on every rank's.
            (
                (
                    f"max by (job, phase, device_kind) ({by_kind(f'max by (job, phase, device) ({scoped(m(_PHASE))})')})",
                    "{{phase}} {{device_kind}}",
                ),
                (
                    f"min by (job, device_kind) ({by_kind(f'min by (job, device) ({scoped(m(_LIMIT))})')})",
                    "limit {{device_kind}}",
                ),
            ),
            w=16,
        ),
        Panel(
            "Time since last step",
            "stat",
            "s",
            "Is the run still making progress? Seconds since the last step boundary, beside the rank's own "
            "median step (the last 32 steps), for the Top K selected ranks that stepped longest ago. "
            "MemexporterTrainingStalled pages when it stays above 10 times the median step (at least 15 "
            "minutes), or 10 times the last duration of an evaluation open on a rank of the run.",
            (
                (stale, "since last step r{{rank}}"),
                (among(m("step_interval_seconds"), stale, KEY), "median step r{{rank}}"),
            ),
            w=8,
            instant=True,
        ),
    )


def overview() -> list[Panel | Row]:
    """The run's figures, then its ranks in a collapsed row."""
    return [*_run(), Row("Ranks: the Top K ($topk) of the selected ranks, per panel", _ranks())]
