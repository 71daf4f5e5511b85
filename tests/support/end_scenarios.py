"""The promtool scenario of an end observed by the exporter's helper (issue 35): SYNTHETIC traces whose
processes have a helper that outlives them for its grace period and serves ``memexporter_job_end_info``.

``alerts/tests/observed_end.yml``: MemexporterFatalOOMSuspected fires on an observed OOM end (the cgroup's
OOM killer, a CUDA OOM), whatever the last peak, with the end's labels; near the limit, on an end observed
otherwise but not clean (an exit status other than 0), with the end's labels; it stays quiet on a clean
exit near the limit, where the inference (the series stopping right after a peak near the limit) would
have fired; and it still infers where no end was observed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.support import REPO_ROOT
from tests.support.scenario_defs import FATAL, GB, STEP, _alone, _file, _flat, _rank, _test, expect
from tests.support.traces import Process, input_series, scrape

HELPER = "as its exporter's helper observed; its per-step peak was at"


def observed_end() -> str:
    limit = 64 * GB
    cases = {
        # a CPU job at 80% of its cgroup (below the inference's 90%) that the cgroup's OOM killer kills
        "killed": Process(
            _rank("cpu-1:9400", "cpu"),
            limit,
            _flat(120, 0.75 * limit, 0.80 * limit),
            ended={"cause": "oom_kill", "exit_code": "", "signal": "SIGKILL"},
        ),
        # a GPU rank at 97% whose uncaught CUDA OOM its helper saw (exit status 1)
        "cuda": Process(
            _rank("gpu-2:9400"),
            80 * GB,
            _flat(120, 0.72 * 80 * GB, 0.97 * 80 * GB),
            ended={"cause": "cuda_oom", "exit_code": "1", "signal": ""},
        ),
        # a GPU rank that finishes cleanly at 95%: the inference alone would page
        "clean": Process(
            _rank("gpu-3:9400"),
            80 * GB,
            _flat(120, 0.70 * 80 * GB, 0.95 * 80 * GB),
            ended={"cause": "exit", "exit_code": "0", "signal": ""},
        ),
        # a GPU rank at 95% that exits with status 3 after catching an OOM it did not name: as inferred, observed
        "status3": Process(
            _rank("gpu-5:9400"),
            80 * GB,
            _flat(120, 0.70 * 80 * GB, 0.95 * 80 * GB),
            ended={"cause": "exit", "exit_code": "3", "signal": ""},
        ),
        # an exporter without a helper (or one gone with its node) at 96%: inferred, as before
        "unobserved": Process(_rank("gpu-4:9400"), 80 * GB, _flat(120, 0.70 * 80 * GB, 0.96 * 80 * GB), gone=True),
    }
    cases = {name: _alone(p) for name, p in cases.items()}
    series = input_series(scrape(list(cases.values()), STEP, 45 * 60))
    killed, cuda, unobserved = cases["killed"].labels, cases["cuda"].labels, cases["unobserved"].labels
    status3 = (
        {"severity": "warning", "scope": "rank", **cases["status3"].labels, "run_id": "gpu-5-4242", "cause": "exit"}
        | {"exit_code": "3"},
        FATAL,
        "Rank 0 of job memexporter on gpu-5:9400 (cuda:0) ended (exit 3, as its exporter's helper observed) right "
        "after its per-step peak reached 95% of its limit: it probably died of an out-of-memory error, an uncaught "
        "CUDA OOM or the kernel's OOM killer. Check its exit status and log.",
    )
    # The four that fire (a clean exit never does), at 33m and still at 40m.
    firing = [
        (
            {
                "severity": "warning",
                "scope": "rank",
                **killed,
                "run_id": "cpu-1-4242",
                "cause": "oom_kill",
                "signal": "SIGKILL",
            },
            FATAL,
            "Rank 0 of job memexporter on cpu-1:9400 (cpu) ended by the memory cgroup's OOM killer (SIGKILL), "
            f"{HELPER} 80% of its limit.",
        ),
        (
            {
                "severity": "warning",
                "scope": "rank",
                **cuda,
                "run_id": "gpu-2-4242",
                "cause": "cuda_oom",
                "exit_code": "1",
            },
            FATAL,
            "Rank 0 of job memexporter on gpu-2:9400 (cuda:0) ended by a CUDA out-of-memory error (exit status 1), "
            f"{HELPER} 97% of its limit.",
        ),
        (
            {"severity": "warning", "scope": "rank", **unobserved, "run_id": "gpu-4-4242"},
            FATAL,
            "Rank 0 of job memexporter on gpu-4:9400 (cuda:0) stopped answering scrapes right after its "
            "per-step peak reached 96% of its limit: it probably died of an out-of-memory error, an uncaught "
            "CUDA OOM or the kernel's OOM killer. Check its exit status and log.",
        ),
        status3,
    ]
    checks = (
        "    alert_rule_test:\n"
        "      # All five end right after their step at 30m. The helpers serve the end from the scrape at 30m15s: the\n"
        "      # observed OOMs are pending at 31m and fire at 33m, as the unobserved one (its series gone at 31m).\n"
        + expect("MemexporterFatalOOMSuspected", "32m")
        + expect(
            "MemexporterFatalOOMSuspected",
            "33m",
            firing,
        )
        + "      # Long after the grace period (the helpers exited at 31m05s: the targets are down), the clean end at\n"
        + "      # 95% still infers nothing: its observed end stays within the lost window.\n"
        + expect(
            "MemexporterFatalOOMSuspected",
            "40m",
            firing,
        )
    )
    return _file(
        """
The job's end, observed (issue 35): the exporter's helper outlives the job for its grace period (65 s) and
serves memexporter_job_end_info. MemexporterFatalOOMSuspected fires on an observed OOM end (cgroup OOM kill,
CUDA OOM) with the end's labels, whatever the last peak; an end observed as a clean exit silences the
inference; without an observed end, the inference works as before (alerts/tests/fatal_oom.yml).
Units: scrapes every 15 s, rules every 1 m. Generated traces (tests/support/end_scenarios.py).
""",
        "../memexporter.rules.yml",
        "1m",
        [
            _test(
                "ends observed by the helper, and one that is not",
                """
cpu-1 (80%, killed by the cgroup's OOM killer), gpu-2 (97%, an uncaught CUDA OOM), gpu-3 (95%, a clean
exit), gpu-5 (95%, exit status 3) and gpu-4 (96%, no helper: its pod goes) all end at 30m.
""",
                "15s",
                series,
                checks,
            )
        ],
    )


GENERATED: dict[Path, Callable[[], str]] = {REPO_ROOT / "alerts" / "tests" / "observed_end.yml": observed_end}
