"""The H200's native 8 MiB trace as a promtool scenario: the same shape, stretched to an hour.

A job leaking 8 MiB a step died of a real CUDA OOM on an NVIDIA H200 (tests/fixtures/recorded/traces/
trace-native-8mib.json) 20 s after its start, with 80 % of its 6 GiB limit allocated: the native
allocator's 20 MiB segments had stranded the rest. Here each step is taken at its recorded time
times ``STRETCH``, so the OOM comes 56 minutes in, scraped every 15 s through the real estimator
(``traces.scrape``, committed bytes included) against the default rules. The rules must warn and
page before the OOM. The same job as an exporter from before the committed figures reported it
(allocated only: ``committed=False``) is paged too late: the scenario's second test says so.
"""

from __future__ import annotations

from tests.support import REPO_ROOT
from tests.support.h200_traces import Trace, load_trace
from tests.support.traces import Process, Step, input_series, scrape

ALERTS_TESTS = REPO_ROOT / "alerts" / "tests"
STRETCH = 170
SCRAPE = 15.0


def h200_steps(trace: Trace, stretch: float = STRETCH) -> list[Step]:
    """``(t, baseline, peak, committed)`` per recorded step: t from the first row, times ``stretch``;
    the peak is the lifetime high-water mark, which rose at every step of this leak (so the exporter's
    step peak is exactly it); committed is allocated plus the inactive split bytes (native allocator)."""
    t0 = trace.rows[0]["t"]
    return [
        (
            (r["t"] - t0) * stretch,
            r["allocated_bytes.all.current"],
            r["allocated_bytes.all.peak"],
            r["allocated_bytes.all.current"] + r["inactive_split_bytes.all.current"],
        )
        for r in trace.rows
    ]


def h200_series(committed: bool = True) -> tuple[str, float]:
    """The scenario's input series and the OOM's time in scenario seconds."""
    trace = load_trace("trace-native-8mib")
    labels = {"job": "memexporter", "instance": "h200:9400", "rank": "0", "device": "cuda:0"}
    job = Process(labels, float(trace.limit), h200_steps(trace), committed=committed, run_id="h200-472")
    oom = (trace.oom_at - trace.rows[0]["t"]) * STRETCH
    return input_series(scrape([job], SCRAPE, oom + 10 * 60)), oom


def gpu_oom() -> str:
    """``alerts/tests/gpu_oom.yml``: the stretched H200 trace against the default rules."""
    from tests.support.scenario_defs import IMMINENT, _file, _test, expect

    series, oom = h200_series()
    old, _ = h200_series(committed=False)
    who = "Rank 0 of job memexporter on h200:9400 (cuda:0)"
    labels = {"job": "memexporter", "instance": "h200:9400", "rank": "0", "device": "cuda:0", "run_id": "h200-472"}
    minute = int(oom // 60)

    def count(alert: str, minutes: int | None) -> str:
        head = f'      - expr: count_over_time(ALERTS{{alertname="{alert}",alertstate="firing"}}[1h])\n'
        head += f"        eval_time: {minute}m\n"
        if minutes is None:
            return head + "        exp_samples: []\n"
        return (
            head
            + "        exp_samples:\n"
            + f'          - labels: \'{{alertname="{alert}",alertstate="firing",device="cuda:0",'
            f'instance="h200:9400",job="memexporter",rank="0",run_id="h200-472",scope="rank",'
            f'severity="{"critical" if alert.endswith("Imminent") else "warning"}"}}\'\n'
            f"            value: {minutes}\n"
        )

    checks = (
        "    alert_rule_test:\n"
        "      # The committed peak passes 50 % at 28m; 15 minutes of for: later, 13 minutes before the OOM.\n"
        + expect("MemexporterOOMPredicted", "42m")
        + expect(
            "MemexporterOOMPredicted",
            "43m",
            [
                (
                    {"severity": "warning", "scope": "rank", **labels},
                    "Training memory is predicted to run out within 2h.",
                    f"{who} is predicted to run out of memory in 12m 52s: its per-step peak, over 50% of the limit, "
                    "keeps growing.",
                )
            ],
        )
        + "      # The page: the committed peak over 80 % with the ETA under 30m from 45m, then 10m of for:.\n"
        + expect("MemexporterOOMImminent", "54m")
        + expect(
            "MemexporterOOMImminent",
            "55m",
            [
                (
                    {"severity": "critical", "scope": "rank", **labels},
                    "Training memory is about to run out.",
                    f"{who} peaks at 98.44% of its limit {IMMINENT}30m: it is about to run out of memory.",
                )
            ],
        )
        + "    promql_expr_test:\n"
        + f"      # Minutes each fired before the OOM at {oom / 60:.1f} min.\n"
        + count("MemexporterOOMPredicted", 14)
        + count("MemexporterOOMImminent", 2)
    )
    old_checks = (
        "    promql_expr_test:\n"
        "      # Warned (the step peak passes 50 %), never paged: the step peak never passes 81 % of the limit.\n"
        + count("MemexporterOOMPredicted", 8)
        + count("MemexporterOOMImminent", None)
    )
    text = _file(
        f"""
A real CUDA OOM under PyTorch's default (native) caching allocator (issue 34): the NVIDIA H200 trace
tests/fixtures/recorded/traces/trace-native-8mib.json (a job leaking 8 MiB a step into the OOM under a
6 GiB memory fraction), each step at its recorded time x {STRETCH}: the OOM at {oom / 60:.1f} min. The
native allocator carved the 8 MiB tensors out of 20 MiB segments: the job died with 80 % of its
limit allocated and 99.7 % committed. Scrapes every 15 s, rules every 1 m, the default rules. The
exporter's series are what memexporter.oom.trend computes at each scrape (tests/support/trace_scenarios.py).
""",
        "../memexporter.rules.yml",
        "1m",
        [
            _test(
                "the H200's native OOM stretched to an hour, warned and paged before it",
                "The exporter's committed peak: the level every OOM gate reads.",
                "15s",
                series,
                checks,
            ),
            _test(
                "the same job as an exporter without the committed figures reported it, never paged",
                "Its step peak (allocated) alone: the rules fall back on it, and the page never comes.",
                "15s",
                old,
                old_checks,
            ),
        ],
    )
    return text.replace(
        "(tests/support/scenario_defs.py): edit there", "(tests/support/trace_scenarios.py): edit there"
    )


GENERATED = {ALERTS_TESTS / "gpu_oom.yml": gpu_oom}
