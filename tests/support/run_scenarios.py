"""The promtool scenarios of issue 25: runs of many ranks, one page per run for a shared cause.

``runs()`` writes ``alerts/tests/runs.yml``. Its first test: SYNTHETIC traces of three runs scraped
by one job, through the real estimator (``traces.scrape``); the per-run records are checked against
values computed here from the same scraped series (``_At``), the alert expectations are written by
hand. Its second (``run_causes.py``): the other alerts' causes on every rank of a run, or on one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO_ROOT
from tests.support.run_causes import causes, causes_checks
from tests.support.scenario_defs import GB, STEP, _file, _test, expect
from tests.support.traces import Process, Scraped, Step, as_written, input_series, jitter, scrape, steps

MINUTES = 75
LIMIT = 100 * GB
IMMINENT = (
    "(in its training steps or, when that is higher, in its last evaluation or checkpoint), or is growing "
    "towards it within 30m: it is about to run out of memory."
)


def _labels(run: str, rank: int, **target: str) -> dict[str, str]:
    return {
        "job": "memexporter",
        **target,
        "instance": f"{run}-{rank // 8}:{9400 + rank % 8}",
        "rank": str(rank),
        "device": f"cuda:{rank % 8}",
    }


def _leaking(rank: int, n: int, lead: float, slope: float) -> list[Step]:
    """A warm-up to ``30e9 + lead`` in 20 steps, then ``slope`` bytes more a step; the step peak 15e9
    above (+-0.4e9 with the batch), and an evaluation at 30m that adds 6e9 to it for 8 steps."""

    def base(i: int) -> float:
        top = 30 * GB + lead
        return top - (top - 10 * GB) * (1 - i / 20) ** 2 if i < 20 else top + slope * (i - 20)

    shape = jitter(rank + 1, 0.4 * GB)
    return steps(n, STEP, base, lambda i, b: b + 15 * GB + shape(i) + (6 * GB if 120 <= i < 128 else 0.0))


def _healthy(rank: int, n: int, start: float = 0.0) -> list[Step]:
    """Warm-up to 55e9, 1.5e9 of creep over 40 steps, then flat; the peak 20e9 above (+-1e9)."""

    def base(i: int) -> float:
        return 55 * GB - 45 * GB * (1 - i / 20) ** 2 if i < 20 else 55 * GB + 1.5 * GB * min(i - 20, 40) / 40

    shape = jitter(rank + 11, 1 * GB)
    return steps(n, STEP, base, lambda i, b: b + 20 * GB + shape(i), start=start)


# llm-a: every rank leaks alike (code that every rank runs), rank 3 a little faster and fuller. It
# reaches its limit at step 205 (51m 15s); that OOM ends the whole run (torchrun stops the others).
OOM_STEP = 205
LLM_A = [
    Process(
        _labels("a", r),
        LIMIT,
        _leaking(r, OOM_STEP, r * GB, 0.25 * GB + r * 0.01 * GB),
        run_id="llm-a",
        run_id_source="torchelastic",
        used=True,
    )
    for r in range(4)
]
# llm-b: healthy at 75-78 %; rank 2's process restarts at 30m (preempted), back from 33m.
LLM_B = [Process(_labels("b", r), LIMIT, _healthy(r, MINUTES * 4), run_id="llm-b", used=True) for r in (0, 1, 3)] + [
    Process(_labels("b", 2), LIMIT, _healthy(2, 120), run_id="llm-b", used=True),
    Process(_labels("b", 2), LIMIT, _healthy(2, (MINUTES - 33) * 4, start=33 * 60), run_id="llm-b", used=True),
]
# legacy-7: relabelled by the operator (target labels namespace and run_id). Rank 0 runs an exporter
# from before run_info; rank 1 exports run_info under torchelastic's id, which Prometheus renames
# exported_run_id. Both leak slowly from half full.
LEGACY = {"namespace": "ml", "run_id": "legacy-7"}
LEGACY_7 = [
    Process(_labels("legacy", 0, **LEGACY), LIMIT, _leaking(0, MINUTES * 4, 10 * GB, 0.1 * GB), build_info=True),
    Process(
        _labels("legacy", 1, **LEGACY),
        LIMIT,
        _leaking(1, MINUTES * 4, 10 * GB, 0.1 * GB),
        run_id="f3a9c2",
        run_id_source="torchelastic",
    ),
]


@dataclass(frozen=True)
class _At:
    """The scraped series at one evaluation, read the way the records read them."""

    scraped: Scraped
    k: int  # the scrape index at the evaluation

    def last(self, name: str, labels: dict[str, str]) -> float:
        value = self.scraped.values[name + "{" + ",".join(f'{n}="{v}"' for n, v in labels.items()) + "}"][self.k]
        assert value is not None and not math.isnan(value), (name, labels)
        return as_written(value)

    def util(self, labels: dict[str, str]) -> float:
        """max_over_time(peak[5m]) / limit: the window's first sample never decides (so it does not
        matter whether the window includes it, as Prometheus 2 does, or not, as 3 does)."""
        key = "memexporter_memory_peak_bytes{" + ",".join(f'{n}="{v}"' for n, v in labels.items()) + "}"
        window = [as_written(v) for v in self.scraped.values[key][self.k - 20 : self.k + 1] if v is not None]
        assert max(window[1:]) >= window[0], labels
        return max(window) / self.last("memexporter_memory_limit_bytes", labels)


def _sample(labels: str, value: float) -> str:
    return f"          - labels: '{labels}'\n            value: {value!r}\n"


def _records(at: _At, t: str) -> str:
    """The per-run records of llm-a at ``t``, from the series as scraped."""
    utils = {r: at.util(p.labels) for r, p in enumerate(LLM_A)}
    worst = max(utils, key=lambda r: utils[r])
    run = 'device_kind="cuda",job="memexporter",run_id="llm-a"'
    w = LLM_A[worst].labels
    out = "".join(
        f'      - expr: {name}{{run_id="llm-a"}}\n        eval_time: {t}\n        exp_samples:\n'
        + sample.replace("'{", f"'{name}{{")
        for name, sample in (
            ("run_device_kind:memexporter_memory_peak_utilisation:max", _sample(f"{{{run}}}", max(utils.values()))),
            (
                "run_device_kind:memexporter_memory_peak_utilisation:worst_rank",
                _sample(
                    f'{{device="{w["device"]}",{run},instance="{w["instance"]}",rank="{w["rank"]}"}}', utils[worst]
                ),
            ),
            (
                "run_device_kind:memexporter_memory_peak_utilisation:spread",
                _sample(f"{{{run}}}", max(utils.values()) - min(utils.values())),
            ),
            (
                "run_device_kind:memexporter_oom_eta_seconds:min",
                _sample(f"{{{run}}}", min(at.last("memexporter_oom_eta_seconds", p.labels) for p in LLM_A)),
            ),
            (
                "run_device_kind:memexporter_memory_used_bytes:sum",
                _sample(f"{{{run}}}", sum(at.last("memexporter_memory_used_bytes", p.labels) for p in LLM_A)),
            ),
            ("run_device_kind:memexporter_memory_limit_bytes:sum", _sample(f"{{{run}}}", 4 * LIMIT)),
            (
                "run_device_kind:memexporter_leak_rate_bytes_per_second:max",
                _sample(f"{{{run}}}", max(at.last("memexporter_leak_rate_bytes_per_second", p.labels) for p in LLM_A)),
            ),
        )
    )
    return out


def _rank(p: Process, severity: str = "warning") -> dict[str, str]:
    return {"severity": severity, "scope": "rank", **p.labels, "run_id": p.labels.get("run_id", p.run_id)}


def run_labels(run: str, severity: str = "warning", **target: str) -> dict[str, str]:
    """The labels of a run alert of ``run``."""
    return {"severity": severity, "scope": "run", "job": "memexporter", **target, "run_id": run}


def _who(p: Process) -> str:
    return f"Rank {p.labels['rank']} of job memexporter on {p.labels['instance']} ({p.labels['device']})"


LEAK, LEAKS = (
    "Memory held between training steps keeps growing.",
    "Memory held between training steps keeps growing on several ranks of a run.",
)
PREDICTED, PREDICTS = (
    "Training memory is predicted to run out within 2h.",
    "Training memory of several ranks of a run is predicted to run out within 2h.",
)
SHARED = "A cause that every rank shares (the code, the model, the data): fix it once."


def _leaks() -> list[tuple[dict[str, str], str, str]]:
    """MemoryLeak, run-wide: llm-a (every rank) and legacy-7 (both ranks, rank 0 without run_info)."""
    return [
        (
            run_labels("llm-a"),
            LEAKS,
            "Run llm-a of job memexporter: 4 of 4 ranks hold more memory between steps every hour; "
            "the fastest: rank 3 on a-0:9403 (cuda:3), 67.2% of its limit per hour. A leak in code that every rank runs: "
            "find it on one rank.",
        ),
        (
            run_labels("legacy-7", namespace="ml"),
            LEAKS,
            "Run legacy-7 of job memexporter in namespace ml: 2 of 2 ranks hold "
            "more memory between steps every hour; the fastest: rank 0 on legacy-0:9400 (cuda:0), 24% of its limit per "
            "hour. A leak in code that every rank runs: find it on one rank.",
        ),
    ]


def _predicts(a: str, legacy: tuple[str, str]) -> list[tuple[dict[str, str], str, str]]:
    return [
        (
            run_labels("llm-a"),
            PREDICTS,
            "Run llm-a of job memexporter: 4 of 4 ranks are predicted to run out of memory within "
            f"2h; the soonest: rank 3 on a-0:9403 (cuda:3), in {a}. {SHARED}",
        ),
        (
            run_labels("legacy-7", namespace="ml"),
            PREDICTS,
            "Run legacy-7 of job memexporter in namespace ml: 2 of 2 ranks are "
            f"predicted to run out of memory within 2h; the soonest: rank {legacy[0]} on legacy-0:940{legacy[0]} "
            f"(cuda:{legacy[0]}), in {legacy[1]}. {SHARED}",
        ),
    ]


def _alerts() -> str:
    a, legacy = LLM_A, LEGACY_7
    grows = ("60%", "62.4%", "64.8%", "67.2%")
    eta = ("32m 11s", "29m 2s", "26m 7s", "23m 25s")
    imminent = "Training memory of several ranks of a run is about to run out."
    fatal = "A training process died near its memory limit: probably an OOM."
    last = ("90.87%", "93.79%", "96.71%", "99.63%")
    run_fatal = (
        run_labels("llm-a"),
        "Several ranks of a run died near their memory limit: probably an OOM.",
        "Run llm-a of job memexporter: 4 ranks stopped answering scrapes right after their per-step peaks came "
        "near their limits (no ranks of the run still answer); the fullest: rank 3 on a-0:9403 (cuda:3), at "
        "99.63% of its limit. The run probably died of an out-of-memory error: check the exit status and log "
        "of that rank first.",
    )
    return (
        "    alert_rule_test:\n"
        "      # Every rank of llm-a meets MemoryLeak's and OOMPredicted's conditions from 13m (the exporter's first\n"
        "      # slope), both legacy-7 ranks too: each run alert fires after its for: of 10m, the rank alerts 5\n"
        "      # minutes later (15m). Nothing of llm-b, whose rank 2 restarts at 30m.\n"
        + expect("MemexporterMemoryLeak", "22m")
        + expect("MemexporterMemoryLeak", "23m", _leaks())
        + expect("MemexporterOOMPredicted", "23m", _predicts("28m 34s", ("1", "1h 34m 24s")))
        + "      # Then every rank alert: each carries its run_id (joined from run_info, or legacy-7's own label),\n"
        "      # and Alertmanager mutes them while their run alert fires.\n"
        + expect(
            "MemexporterMemoryLeak",
            "28m",
            [
                (
                    _rank(p),
                    LEAK,
                    f"{_who(p)} holds more memory between steps every hour: its baseline grows by {g} of the "
                    "limit per hour.",
                )
                for p, g in zip(a, grows, strict=True)
            ]
            + [
                (
                    _rank(p),
                    LEAK,
                    f"{_who(p)} holds more memory between steps every hour: its baseline grows by 24% of the "
                    "limit per hour.",
                )
                for p in legacy
            ]
            + _leaks(),
        )
        + expect(
            "MemexporterOOMPredicted",
            "28m",
            [
                (
                    _rank(p),
                    PREDICTED,
                    f"{_who(p)} is predicted to run out of memory in {e}: its per-step peak, over 50% of "
                    "the limit, keeps growing.",
                )
                for p, e in zip(a + legacy, (*eta, "1h 29m 23s", "1h 29m 11s"), strict=True)
            ]
            + _predicts("23m 25s", ("1", "1h 29m 11s")),
        )
        + "      # OOMImminent: ranks 3 and 2 from 31m, the run alert after its 5m; the rank alerts after their 10m.\n"
        + expect("MemexporterOOMImminent", "35m")
        + expect(
            "MemexporterOOMImminent",
            "36m",
            [
                (
                    run_labels("llm-a", "critical"),
                    imminent,
                    "Run llm-a of job memexporter: 3 of 4 ranks are about to run out of memory; the fullest: rank 3 on a-0:9403 "
                    "(cuda:3), at 83.59% of its limit. A cause that every rank shares (the batch, the model, an evaluation, a "
                    "leak): fix it once.",
                )
            ],
        )
        + expect(
            "MemexporterOOMImminent",
            "41m",
            [
                (
                    _rank(p, "critical"),
                    "Training memory is about to run out.",
                    f"{_who(p)} peaks at {u} of its limit " + IMMINENT,
                )
                for p, u in ((a[2], "85.48%"), (a[3], "87.98%"))
            ]
            + [
                (
                    run_labels("llm-a", "critical"),
                    imminent,
                    "Run llm-a of job memexporter: 4 of 4 ranks are about to run out of memory; the fullest: rank 3 on a-0:9403 "
                    "(cuda:3), at 87.98% of its limit. A cause that every rank shares (the batch, the model, an evaluation, a "
                    "leak): fix it once.",
                )
            ],
        )
        + "      # Rank 3's OOM at 51m 15s ends the run: pending from 52m, the run alert (for: 1m) first.\n"
        + expect("MemexporterFatalOOMSuspected", "52m")
        + expect("MemexporterFatalOOMSuspected", "53m", [run_fatal])
        + expect(
            "MemexporterFatalOOMSuspected",
            "54m",
            [
                (
                    _rank(p),
                    fatal,
                    f"{_who(p)} stopped answering scrapes right after its per-step peak reached {u} of its "
                    "limit: it probably died of an out-of-memory error, an uncaught CUDA OOM or the kernel's OOM killer. "
                    "Check its exit status and log.",
                )
                for p, u in zip(a, last, strict=True)
            ]
            + [run_fatal],
        )
    )


def _first_run_then_ranks() -> str:
    """No rank alert of a run fired for more evaluations than its run alert: none fired before it."""
    out = ""
    for alert in (
        "MemexporterOOMPredicted",
        "MemexporterOOMImminent",
        "MemexporterMemoryLeak",
        "MemexporterFatalOOMSuspected",
    ):
        firing = f'count_over_time(ALERTS{{alertname="{alert}",alertstate="firing",scope="%s"}}[1h15m])'
        out += (
            f"      - expr: {firing % 'rank'} > on(job, namespace, run_id) group_left() {firing % 'run'}\n"
            "        eval_time: 1h15m\n        exp_samples: []\n"
        )
    return out


def runs() -> str:
    scraped = scrape(LLM_A + LLM_B + LEGACY_7, STEP, MINUTES * 60)
    series = input_series(scraped)
    count = "run:memexporter_ranks:count"
    checks = (
        _alerts() + "    promql_expr_test:\n"
        "      # The per-run records 40 minutes in, as computed from the series the exporter served.\n"
        + _records(_At(scraped, 40 * 4), "40m")
        + "      # The ranks of each run that answer; legacy-7's rank 0 through its build_info.\n"
        f"      - expr: {count}\n        eval_time: 40m\n        exp_samples:\n"
        + _sample(f'{count}{{job="memexporter",run_id="llm-a"}}', 4)
        + _sample(f'{count}{{job="memexporter",run_id="llm-b"}}', 4)
        + _sample(f'{count}{{job="memexporter",namespace="ml",run_id="legacy-7"}}', 2)
        + "      # The relabelled run_id wins: nothing carries the exporter's own (f3a9c2).\n"
        '      - expr: count_over_time(ALERTS{run_id="f3a9c2"}[1h15m]) or count_over_time(ALERTS{exported_run_id!=""}[1h15m])\n'
        "        eval_time: 1h15m\n        exp_samples: []\n"
        + "      # llm-b, healthy, its restart included: nothing ever fired, per rank or per run.\n"
        '      - expr: count_over_time(ALERTS{run_id="llm-b",alertstate="firing"}[1h15m])\n'
        "        eval_time: 1h15m\n        exp_samples: []\n"
        + "      # When every rank of a run meets a condition, its run alert fires no later than its rank alerts.\n"
        + _first_run_then_ranks()
    )
    return _file(
        """
One page per run (issue 25): the ranks of a run share a cause, so each alert also fires once per
run (scope "run") when two or more of its ranks meet its condition, no later than their own alerts
(scope "rank"), and names how many ranks and the worst. Alertmanager mutes the rank alerts of a
run while its run alert fires. A cause on one rank fires no run alert.
The run of a rank comes from the exporter's memexporter_run_info (or a run_id target label).
Units: 100 GB devices (1e9 bytes is 1% of the limit); scrapes every 15 s, rules every 1 m; one
training step per scrape. Generated traces (tests/support/run_scenarios.py).
""",
        "../memexporter.rules.yml",
        "1m",
        [
            _test(
                "every rank of one run leaks, beside a healthy run and a relabelled one",
                """
llm-a (4 ranks): every rank leaks from its warm-up, alike (rank r 1e9 r higher and 0.01e9 r a step
faster); an evaluation at 30m; rank 3 reaches its limit at 51m 15s and the run dies with it.
llm-b (4 ranks): healthy at 75-78% (peaks +-1e9); rank 2 is preempted at 30m and back at 33m.
legacy-7 (2 ranks, namespace ml; the operator's relabelling sets run_id): rank 0's exporter has no
run_info (build_info only), rank 1's names its run f3a9c2 (exported_run_id). Both leak slowly.
""",
                "15s",
                series,
                checks,
            ),
            _test(
                "a cause on every rank of one run, and on one rank of another",
                """
Run shared (3 ranks): each rank retries cudaMalloc, fragments, loses its NVML collector and stops
stepping from 10m, 11m and 12m (one cause, seen a minute apart), and OOMs once at 30m. Run one
(3 ranks): rank 1 alone does all of that, from 10m.
""",
                "15s",
                "    input_series:\n" + causes(),
                causes_checks(),
            ),
        ],
    )


GENERATED: dict[Path, Callable[[], str]] = {REPO_ROOT / "alerts" / "tests" / "runs.yml": runs}
