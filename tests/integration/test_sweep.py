"""`memexporter sweep` end to end: real child processes, real torch on CPU, read over their /metrics.

The measured script keeps ``batch x 16 MiB`` of tensors alive (``torch.ones``: the pages are
touched, so they are resident), so the peaks must grow by 16 MiB per batch unit. Each child
imports torch (a few CPU seconds on a small machine): the grids are small and the tests slow.
"""

from __future__ import annotations

import csv
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import forkserver
from tests.support.demo import module_env

pytestmark = pytest.mark.integration

UNIT_MIB = 16
SCRIPT = textwrap.dedent(
    f"""
    import os, sys, time
    import torch
    batch = int(sys.argv[1])
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    held = [torch.ones({UNIT_MIB} << 18) for _ in range(batch)]  # batch x {UNIT_MIB} MiB, resident
    for step in range(100_000):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        if step == 0 and len(sys.argv) > 2:
            with open(sys.argv[2] + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(sys.argv[2] + ".tmp", sys.argv[2])  # the pid, once a step is done
        time.sleep(0.05)
    """
)


def sweep(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out_json = tmp_path / f"sweep-{time.monotonic_ns()}.json"
    argv = [sys.executable, "-m", "memexporter", "sweep", "--json", str(out_json), *args]
    proc = forkserver.run(argv, env=module_env(), cwd=tmp_path, timeout=timeout)  # each point: a fresh process
    assert out_json.exists(), proc.stdout + proc.stderr
    return proc, json.loads(out_json.read_text())


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "hold.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.slow(seconds=55)
def test_peaks_fits_and_max_fit_on_a_script_of_known_memory(tmp_path: Path, script: Path) -> None:
    # Calibrate: what batch=1 peaks at on this machine (the interpreter and torch are most of it).
    _, first = sweep(tmp_path, "--grid", "batch=1", "--steps", "3", "--", sys.executable, str(script), "{batch}")
    base = first["runs"][0]["peak_bytes"] / 2**20
    assert first["max_fit"]["measured"] == {"batch": 1} and first["max_fit"]["predicted"] is None
    # A limit halfway between batch=3 and batch=4: 1..3 fit, 4 goes over, 8 is never started.
    limit = base + 2.5 * UNIT_MIB
    plot, table_csv = tmp_path / "sweep.png", tmp_path / "sweep.csv"
    proc, doc = sweep(
        tmp_path,
        "--grid",
        "batch=8,4,3,2,1",
        "--steps",
        "24",
        "--limit-mib",
        f"{limit:.1f}",
        "--csv",
        str(table_csv),
        "--plot",
        str(plot),
        "--",
        sys.executable,
        str(script),
        "{batch}",
    )
    assert proc.returncode == 0, proc.stderr
    runs = {r["params"]["batch"]: r for r in doc["runs"]}
    assert [r["params"]["batch"] for r in doc["runs"]] == [1, 2, 3, 4, 8]  # small to large
    assert [runs[b]["fits"] for b in (1, 2, 3, 4, 8)] == [True, True, True, False, False]
    assert runs[4]["oom"] and runs[4]["oom_reason"].startswith("peak ") and "over the limit" in runs[4]["oom_reason"]
    assert runs[8]["skipped"] and runs[8]["skipped_because"] == {"batch": 4} and runs[8]["peak_bytes"] is None
    growth = [(runs[b + 1]["peak_bytes"] - runs[b]["peak_bytes"]) / 2**20 for b in (1, 2, 3)]
    assert all(abs(g - UNIT_MIB) <= 0.2 * UNIT_MIB for g in growth), growth
    for b in (1, 2, 3, 4):
        assert (
            runs[b]["steps"] >= 24
            and runs[b]["device"] == "cpu"
            and runs[b]["limit_bytes"] == round(float(f"{limit:.1f}") * 2**20)
        )
        # The script sleeps 50 ms a step. Each step-count change is placed within half a poll gap,
        # and on a loaded 2-core box a gap can stretch from 100 ms to ~300: over 23 step intervals
        # that is 13 ms at most (over 7, as this test once used, it read 26 ms a step).
        assert 0.035 <= runs[b]["step_seconds"] < 0.5, runs[b]["step_seconds"]
        assert runs[b]["baseline_bytes"] <= runs[b]["peak_bytes"]
    assert doc["max_fit"]["measured"] == {"batch": 3}
    assert doc["max_fit"]["predicted"] == 3, doc["max_fit"]  # the line reaches the limit at ~3.5
    assert abs(doc["max_fit"]["fit"]["slope_bytes_per_unit"] / 2**20 - UNIT_MIB) <= 0.2 * UNIT_MIB
    # The terminal table, the CSV and the plot.
    assert (
        "largest that fits, measured:  batch=3" in proc.stdout and "skipped (batch=4 ran out of memory)" in proc.stdout
    )
    with table_csv.open() as fh:
        assert [row["fits"] for row in csv.DictReader(fh)] == ["True", "True", "True", "False", "False"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _terminal(master: int, proc: subprocess.Popen[str], until: re.Pattern[bytes], seconds: float) -> bytes:
    """What the sweep wrote to its terminal (``master``: the pty's other end) until ``until`` matches, it
    exits (the pty then reads EIO), or ``seconds`` pass."""
    shown, deadline = b"", time.monotonic() + seconds
    while not until.search(shown) and time.monotonic() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            try:
                shown += os.read(master, 4096)
            except OSError:  # EIO: nothing holds the terminal any more
                break
        elif proc.poll() is not None and not select.select([master], [], [], 0)[0]:
            break
    return shown


@pytest.mark.slow
def test_ctrl_c_stops_the_child_and_writes_what_was_measured(tmp_path: Path, script: Path) -> None:
    # At a terminal, as a user presses Ctrl-C: its progress line says when the sweep has read a step from the
    # child's /metrics. A fixed second after the child's first step was once too little: the child's
    # helper starts and publishes a snapshot a second, and the sweep had read no step when interrupted.
    pidfile, out_json = tmp_path / "child.pid", tmp_path / "partial.json"
    master, tty = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memexporter",
            "sweep",
            "--grid",
            "batch=1,2",
            "--steps",
            "100000",
            "--json",
            str(out_json),
            "--",
            sys.executable,
            str(script),
            "{batch}",
            str(pidfile),
        ],
        stdout=subprocess.PIPE,
        stderr=tty,
        text=True,
        env=module_env(),
        cwd=tmp_path,
    )
    os.close(tty)
    try:
        shown = _terminal(master, proc, re.compile(rb"step [1-9][0-9]*/100000"), 120)
        assert proc.poll() is None and re.search(rb"step [1-9]", shown), shown.decode(errors="replace")
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends the sweep
        shown += _terminal(master, proc, re.compile(rb"(?!)"), 60)  # to its exit
        assert proc.stdout is not None
        stdout = proc.stdout.read()
        proc.wait(10)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    stderr = shown.decode(errors="replace")
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and stdout.splitlines()[1].split()[:2] == ["1", "1"] and "interrupted" in stdout
    child = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the child was ended (and reaped), not left behind
    doc = json.loads(out_json.read_text())
    assert doc["interrupted"] is True and doc["not_run"] == [{"batch": 2}]
    (run,) = doc["runs"]
    assert run["status"] == "interrupted" and run["fits"] is None
    assert run["steps"] >= 1 and run["peak_bytes"] > UNIT_MIB * 2**20


@pytest.mark.slow
def test_the_demo_out_of_the_box(tmp_path: Path) -> None:
    # The README's command, made smaller: `memexporter` may not be on PATH here; the sweep then runs
    # this interpreter's module.
    # The demo would train 50 steps: the sweep ends it after 3. A step takes at least 50 ms: unpaced,
    # this tiny model runs all 50 in ~0.2 s on an idle machine, before two polls can time a step.
    proc, doc = sweep(
        tmp_path,
        "--grid",
        "batch=2,8",
        "--steps",
        "3",
        "--",
        "memexporter",
        "demo",
        "--batch",
        "{batch}",
        "--steps",
        "50",
        "--step-interval",
        "0.05",
        "--layers",
        "1",
        "--d-model",
        "32",
        "--seq-len",
        "32",
    )
    assert proc.returncode == 0, proc.stderr
    small, large = doc["runs"]
    for run in (small, large):
        assert run["status"] == "ok" and run["fits"] is True and 3 <= run["steps"] < 50 and run["step_seconds"] > 0
        assert run["exit_code"] == 0  # the demo ends cleanly on the sweep's SIGINT
        assert (
            run["split_bytes"]["parameters"] > 0
            and run["split_bytes"]["optimizer_state"] >= 2 * run["split_bytes"]["parameters"]
        )
    assert small["split_bytes"]["parameters"] == large["split_bytes"]["parameters"]  # the same model
    ratio = large["split_bytes"]["activations"] / small["split_bytes"]["activations"]
    assert 3.2 <= ratio <= 4.8, ratio  # activations are linear in the batch: 8 / 2
    header = proc.stdout.splitlines()[0].split()
    assert header[header.index("baseline") + 1 : header.index("step")] == ["params", "grads", "optim", "activ"]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("raise MemoryError(f'cannot hold batch {sys.argv[1]}')", "out of memory: MemoryError: cannot hold batch 1"),
        ("os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL, which the sweep did not send"),
    ],
)
def test_an_oom_before_the_first_step_skips_the_larger_sizes(tmp_path: Path, code: str, reason: str) -> None:
    # `python -c` children: no exporter and no torch, so these run in a fraction of a second.
    proc, doc = sweep(
        tmp_path, "--grid", "batch=1,2,4", "--", sys.executable, "-c", f"import os, signal, sys\n{code}", "{batch}"
    )
    assert proc.returncode == 0, proc.stderr
    first, *rest = doc["runs"]
    assert first["oom"] and first["fits"] is False and first["oom_reason"].startswith(reason), first["oom_reason"]
    assert [(r["params"], r["skipped"], r["fits"]) for r in rest] == [
        ({"batch": 2}, True, False),
        ({"batch": 4}, True, False),
    ]
    assert doc["max_fit"]["measured"] is None


def test_a_command_failing_before_its_first_step_shows_its_stderr(tmp_path: Path) -> None:
    code = "import sys; print('usage: train.py [--batch N]', file=sys.stderr); print('train.py: error: unrecognized arguments: --bacth', file=sys.stderr); sys.exit(2)"
    proc, doc = sweep(tmp_path, "--grid", "batch=1,2", "--", sys.executable, "-c", code, "--bacth", "{batch}")
    assert proc.returncode == 1
    assert "batch=1" in proc.stderr and "the command failed before its first step (exit code 2)" in proc.stderr
    assert "unrecognized arguments: --bacth" in proc.stderr  # its stderr's tail
    assert doc["error"] is not None and doc["runs"][0]["status"] == "failed" and doc["not_run"] == [{"batch": 2}]


def test_a_command_without_an_exporter_is_named(tmp_path: Path) -> None:
    proc, doc = sweep(tmp_path, "--grid", "n=1", "--", sys.executable, "-c", "print('done', {n})")
    assert proc.returncode == 1
    assert "exited without ever serving /metrics" in proc.stderr and "done 1" in proc.stderr
    assert doc["runs"][0]["fits"] is None


STUBBORN = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "time.sleep(120)\n"
)


def test_a_stuck_command_is_stopped_at_the_timeout_and_killed_after_the_grace(tmp_path: Path) -> None:
    # It ignores SIGINT and SIGTERM and never steps: SIGKILL ends it, and that SIGKILL is ours, not an OOM.
    started = time.monotonic()
    proc, doc = sweep(
        tmp_path,
        "--grid",
        "n=1",
        "--timeout",
        "1",
        "--grace",
        "0.5",
        "--",
        sys.executable,
        "-c",
        STUBBORN,
        str(tmp_path / "pid-{n}"),
    )
    assert time.monotonic() - started < 30
    assert proc.returncode == 1 and "no training step within --timeout (1 s)" in proc.stderr
    (run,) = doc["runs"]
    assert run["exit_code"] == -signal.SIGKILL and run["oom"] is False and run["status"] == "failed"


def test_a_second_ctrl_c_kills_the_child_at_once(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memexporter",
            "sweep",
            "--grid",
            "n=1",
            "--grace",
            "60",
            "--",
            sys.executable,
            "-c",
            STUBBORN,
            str(pidfile) + "{n}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=module_env(),
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "pid1").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # the child ignores the SIGINT it is sent: a 60 s grace begins
        time.sleep(1.0)
        assert proc.poll() is None
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - started < 10 and proc.returncode == 130, stderr
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "pid1").read_text()), 0)


@pytest.mark.slow
def test_a_run_that_fails_after_its_first_step_is_reported_and_the_sweep_goes_on(tmp_path: Path) -> None:
    code = (
        "import sys, torch\n"
        "model = torch.nn.Linear(2, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.ones(1, 2)).sum().backward()\n"
        "opt.step()\n"
        "import time; time.sleep(0.5)\n"  # long enough for a poll to see the step
        "sys.exit(int(sys.argv[1]))\n"
    )
    script = tmp_path / "crash.py"  # a file: the bootstrap leaves `python -c` alone
    script.write_text(code)
    proc, doc = sweep(tmp_path, "--grid", "code=3", "--", sys.executable, str(script), "{code}")
    (run,) = doc["runs"]
    assert run["status"] == "failed" and run["error"] == "exit code 3 after 1 step(s)" and run["fits"] is None
    assert run["steps"] == 1 and run["peak_bytes"] > 0 and run["oom"] is False
    assert proc.returncode == 1 and "1 run(s) failed for a reason other than memory" in proc.stderr


ENDS_EARLY = textwrap.dedent(
    """
    import time, torch, memexporter
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters())
    memexporter.track(model, opt)
    time.sleep(1.5)  # the sweep reads the module rows here, before any step
    for _ in range(3):
        model(torch.randn(2, 64)).sum().backward()
        opt.step()
    time.sleep(0.8)  # scraped at step 3 without the rows, then it ends by itself
    """
)


def test_a_run_that_ends_by_itself_reports_its_module_rows_from_its_last_scrape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's smallest sweep reported 0 bytes of gradients and optimizer state for runs that
    # ended between two reads of the module rows: those read before the first step (issue 27).
    from memexporter.sweep import child

    monkeypatch.setattr(child, "SPLIT_SECONDS", 3600.0)  # the rows are read at the first poll only
    path = tmp_path / "early.py"
    path.write_text(ENDS_EARLY)
    out = child.Child([sys.executable, str(path)], steps=100, timing=child.Timing(timeout=120), env=module_env()).run()
    assert out.stopped_by is None and out.exit_code == 0, out.stderr[-2000:]
    params = (64 * 64 + 64) * 4
    assert out.observed.steps == 3 and out.observed.split_steps == 3
    assert out.observed.split is not None and out.observed.split["gradients"] == params
    assert out.observed.split["optimizer_state"] >= 2 * params  # Adam's exp_avg and exp_avg_sq
