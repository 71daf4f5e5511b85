"""How a training process ended, read over HTTP from its helper after the end (issue 35, item 3).

A real training process (torch on CPU, the exporter started, steps counted) ends each way a job ends: a
clean exit, an exit code, SIGTERM, SIGKILL, an uncaught CUDA out-of-memory error recorded by the
exporter's OOM path (the allocator's observer, called as the allocator calls it: there is no GPU here),
and the memory cgroup's OOM killer (where this machine lets the test make a cgroup). The helper keeps the
port for ``end_grace`` seconds and serves ``memexporter_job_end_info`` with what it established.

The test reaps the job only after reading the answer, as torchrun's agent does (it polls its workers):
the exit status is then a zombie's, which the helper reads in ``/proc``. A parent that reaps at once
races the helper for it; ``test_a_job_reaped_at_once_still_has_an_end`` shows what is left then.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.demo import module_env
from tests.support.web import get_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = """
import os, signal, sys, time
import torch
import memexporter
how, dump, cgroup = sys.argv[1:4]
if cgroup:  # into the test's memory cgroup first: the helper started next is born there too
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
exp = memexporter.start(port=0, addr="127.0.0.1", end_grace=30, oom_dump_dir=dump or None)
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    opt.zero_grad()
exp.flush()
print(exp.port, exp.helper_pid, flush=True)
sys.stdin.readline()  # the test says when
if how == "exit3":
    sys.exit(3)
if how in ("SIGTERM", "SIGKILL"):
    os.kill(os.getpid(), getattr(signal, how))
if how == "cuda_oom":  # what the allocator's observer is called with at an OOM, then the error unwinds
    exp.diagnostics.cuda.on_oom(0, 2 << 30, 80 << 30, 1 << 20)
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
if how == "oom_kill":  # grow until the cgroup's limit: the kernel's OOM killer ends it
    hold = []
    while True:
        hold.append(bytearray(16 << 20))
        for i in range(0, len(hold[-1]), 4096):
            hold[-1][i] = 1
"""
END = re.compile(r"^memexporter_job_end_info\{(.*)\} 1\.0$", re.M)


def labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


def run_and_end(how: str, tmp_path: Path, reap_at_once: bool = False, cgroup: Path | None = None) -> dict[str, str]:
    """Start the job, end it ``how``, and return the end's labels as the helper serves them."""
    dump = str(tmp_path / "dumps") if how == "cuda_oom" else ""
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, how, dump, str(cgroup or "")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=module_env(),
    )
    helper = 0
    try:
        assert job.stdin is not None and job.stdout is not None
        port, helper = (int(x) for x in job.stdout.readline().split())
        before = get_text(f"http://127.0.0.1:{port}/metrics", 10)
        assert 'memexporter_steps_total{rank="0"} 5.0' in before and "memexporter_job_end_info" not in before
        job.stdin.write("go\n")
        job.stdin.flush()
        if reap_at_once:
            job.wait(60)
        end = time.monotonic() + 60
        while not (found := END.search(body := get_text(f"http://127.0.0.1:{port}/metrics", 10))):
            assert time.monotonic() < end, "the helper never served the end"
            time.sleep(0.1)
        assert 'memexporter_steps_total{rank="0"} 5.0' in body, "the last snapshot is served with the end"
        assert re.search(r"^memexporter_job_end_timestamp_seconds\{rank=\"0\"\} \S+$", body, re.M)
        return labels(found.group(1))
    finally:
        job.kill()
        job.wait(60)
        if helper:
            os.kill(helper, signal.SIGTERM)


@pytest.mark.parametrize(
    ("how", "cause", "exit_code", "signal_name"),
    [
        ("clean", "exit", "0", ""),
        ("exit3", "exit", "3", ""),
        ("SIGTERM", "signal", "", "SIGTERM"),
        ("SIGKILL", "signal", "", "SIGKILL"),
        ("cuda_oom", "cuda_oom", "1", ""),  # the uncaught OutOfMemoryError: Python's status 1
    ],
)
def test_each_kind_of_end_is_served_by_the_helper(
    how: str, cause: str, exit_code: str, signal_name: str, tmp_path: Path
) -> None:
    got = run_and_end(how, tmp_path)
    assert got == {"cause": cause, "exit_code": exit_code, "rank": "0", "signal": signal_name} or (
        # Prometheus drops empty labels; the text format keeps them: either form is the same series.
        {k: v for k, v in got.items() if v}
        == {k: v for k, v in (("cause", cause), ("exit_code", exit_code), ("rank", "0"), ("signal", signal_name)) if v}
    ), got


def test_a_job_reaped_at_once_still_has_an_end(tmp_path: Path) -> None:
    # The status may be gone (the parent reaped first); what the job said at exit is not.
    got = run_and_end("exit3", tmp_path, reap_at_once=True)
    assert got["cause"] == "exit" and got["exit_code"] in ("3", "")


@pytest.fixture
def memory_cgroup(tmp_path: Path) -> Iterator[Path]:
    """A child memory cgroup (v1 or v2) of this process's, limited to 600 MiB; skipped where this
    machine does not let the test make one (not root, a read-only cgroupfs, no memory controller)."""
    made: Path | None = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base, limits = Path("/sys/fs/cgroup") / rel.lstrip("/"), ("memory.max", "memory.swap.max")
        elif "memory" in controllers.split(","):
            base, limits = (
                Path("/sys/fs/cgroup/memory") / rel.lstrip("/"),
                ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
            )
        else:
            continue
        try:
            made = base / f"memexporter-test-{os.getpid()}"
            made.mkdir()
            (made / limits[0]).write_text(str(600 << 20))
            if (made / limits[1]).exists():  # no swap to escape to: the OOM killer acts at the limit
                (made / limits[1]).write_text("0" if limits[1] == "memory.swap.max" else str(600 << 20))
            break
        except OSError as exc:
            if made is not None and made.exists():
                made.rmdir()
            pytest.skip(f"cannot make a memory cgroup here ({base}: {exc}): the cgroup OOM kill is untested")
    if made is None:
        pytest.skip("no memory cgroup controller on this machine: the cgroup OOM kill is untested")
    yield made
    for _ in range(50):
        try:
            made.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def test_the_cgroups_oom_killer_is_named(tmp_path: Path, memory_cgroup: Path) -> None:
    got = run_and_end("oom_kill", tmp_path, cgroup=memory_cgroup)
    assert got["cause"] == "oom_kill" and got["signal"] == "SIGKILL", got
