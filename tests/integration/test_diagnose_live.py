"""The diagnosis end to end, in real processes on CPU (issue 13's "Done when"):

- a user's script that leaks into one of its own attributes, run unmodified under
  ``MEMEXPORTER_DEBUG=1 memexporter run``: ``/debug/memory`` and ``memexporter inspect`` give the
  growing group's shape, its bytes per step (within 25 %) and the attribute, within a few hundred
  steps, and the job's log says it in one line;
- the demo's own leak is named (``TinyGPT.leak_store``) within its leak window; a healthy demo
  shows no growth over many censuses;
- the pre-mortem is on disk before the OOM and survives a SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from memexporter.diagnose.token import find
from tests.support import REPO_ROOT, forkserver
from tests.support.demo import SMALL_MODEL, module_env, running_demo
from tests.support.ports import free_port
from tests.support.process import running_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MiB = 1 << 20
# 10 steps/s, a training job's pace: the leak estimate skips the first 20 steps and 5 s and needs
# a 3 s span (trend.py), so a demo at 20 steps/s would show its leak only after ~160 steps.
TINY = (*SMALL_MODEL, "--step-interval", "0.1")

# A user's training script: it knows nothing about memexporter, and keeps every step's batch.
LEAKY_SCRIPT = textwrap.dedent(
    """
    import time
    import torch
    from torch import nn

    class Trainer:
        def __init__(self):
            self.model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
            self.recent_batches = []  # meant to keep the last few; keeps them all

        def step(self):
            batch = torch.randn(1, 262144)  # 1 MiB
            loss = self.model(batch.view(-1, 64)[:32]).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.recent_batches.append(batch)

    trainer = Trainer()
    for _ in range(3000):
        trainer.step()
        time.sleep(0.05)  # ~20 steps/s: the leak estimate that confirms growth needs >= 8 s (trend.py)
    """
)


# The jobs' debug token: given by hand here (MEMEXPORTER_DEBUG_TOKEN), so the test reads
# /debug/memory with it; `memexporter inspect` finds it in the job's token file instead.
TOKEN = "live-test-debug-token-0123456789"


def debug_env(runtime_dir: Path, **extra: str) -> dict[str, str]:
    """A debug job's environment: its token file under the test's ``tmp_path``."""
    return {"MEMEXPORTER_DEBUG": "1", "MEMEXPORTER_DEBUG_TOKEN": TOKEN, "XDG_RUNTIME_DIR": str(runtime_dir), **extra}


def memory(port: int) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/debug/memory", headers={"Authorization": f"Bearer {TOKEN}"})
    for _ in range(30):
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                doc: dict[str, Any] = json.load(r)
                return doc
        except urllib.error.HTTPError as exc:  # 429: the /debug routes' rate limit; wait as asked
            if exc.code != 429:
                raise
            time.sleep(float(exc.headers.get("Retry-After", "1")))
    raise AssertionError("/debug/memory answered 429 thirty times in a row")


def until(port: int, done: Any, timeout: float = 240.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = memory(port)
        if done(doc):
            return doc
        assert time.monotonic() < deadline, f"not reached in {timeout:.0f} s; last: {json.dumps(doc)[:2000]}"
        time.sleep(0.5)


def named(holder: str) -> Any:
    return lambda doc: any(holder in g["held_by"] for g in doc["growth"])


def test_a_users_leak_is_named_by_debug_memory_inspect_and_the_log(tmp_path: Path) -> None:
    script, log = tmp_path / "train.py", tmp_path / "job.log"
    script.write_text(LEAKY_SCRIPT)
    port = free_port()
    argv = [sys.executable, "-m", "memexporter", "run", "--port", str(port), "--addr", "127.0.0.1", str(script)]
    with running_command(
        argv,
        [f"http://127.0.0.1:{port}/metrics"],
        env=module_env(debug_env(tmp_path)),
        cwd=REPO_ROOT,
        log=log,
        timeout=120,
        what="memexporter run train.py",
    ):
        doc = until(port, named("Trainer.recent_batches (list)"))
        # No token given: inspect reads the job's token file (the job's user, the job's node).
        inspect = subprocess.run(
            [sys.executable, "-m", "memexporter", "inspect", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=module_env({"XDG_RUNTIME_DIR": str(tmp_path), "HOME": str(tmp_path)}),
        )
    top = doc["growth"][0]
    print(
        f"named at census step {doc['census']['step']} (job at step {doc['step']}): "
        f"{top['bytes_per_step'] / MiB:.3f} MiB/step, {top['count_per_step']:+.2f} tensors/step, {top['held_by']}"
    )
    assert top["shape"] == [1, 262144] and top["dtype"] == "float32" and top["device"] == "cpu"
    assert abs(top["bytes_per_step"] - MiB) <= 0.25 * MiB
    assert top["held_by"][0] == "Trainer.recent_batches (list)"
    assert doc["census"]["step"] <= 300
    assert inspect.returncode == 0, inspect.stderr
    out = inspect.stdout
    assert out.index("Growing") < out.index("Census:")
    row = next(line for line in out.splitlines() if "float32[1, 262144]" in line)
    assert "Trainer.recent_batches (list)" in row and "1.0 MiB" in row and "+1" in row
    said = re.findall(
        r"memexporter: leaking ([\d.]+) MiB/step: float32\[1, 262144\] on cpu, \+1 per step, "
        r"held by Trainer\.recent_batches \(list\)",
        log.read_text(),
    )
    assert len(said) == 1 and abs(float(said[0]) - 1.0) <= 0.25, log.read_text()[-3000:]
    assert TOKEN not in log.read_text()
    # The job was stopped with SIGTERM, which runs no clean-up: its token file stays, and inspect skips it.
    assert find(port, {"XDG_RUNTIME_DIR": str(tmp_path), "HOME": str(tmp_path)}) == []


@pytest.mark.slow(seconds=30)  # tracked, two blocks: the levers sized from its rows
def test_the_demos_leak_is_named_within_its_leak_window_and_inspect_says_what_fits(tmp_path: Path) -> None:
    port = free_port()
    with running_demo(port, *TINY, "--layers", "2", "--leak-mib-per-step", "8", env=debug_env(tmp_path)):
        doc = until(port, named("TinyGPT.leak_store (list)"))
        env = module_env({"XDG_RUNTIME_DIR": str(tmp_path), "HOME": str(tmp_path)})
        began = time.monotonic()  # a fresh interpreter, as on the node at 2 a.m.
        inspect = forkserver.run(
            [sys.executable, "-m", "memexporter", "inspect", f"127.0.0.1:{port}"], env=env, fresh=True
        )
        took = time.monotonic() - began
    top = doc["growth"][0]
    print(f"demo leak named at census step {doc['census']['step']}: {top['bytes_per_step'] / MiB:.2f} MiB/step")
    assert top["shape"] == [2097152] and abs(top["bytes_per_step"] - 8 * MiB) <= 2 * MiB
    assert doc["census"]["step"] <= 200  # the default leak window
    # The levers (issue 44), largest first, each an estimate: the leak, by its holder, and the rows' own.
    kinds = [v["kind"] for v in doc["levers"]]
    assert {"leak", "checkpointing", "precision"} <= set(kinds), doc["levers"]
    assert all(v["estimate"] and v["basis"] for v in doc["levers"])
    sized = [v["freed_bytes"] for v in doc["levers"] if v["freed_bytes"] is not None]
    assert sized == sorted(sized, reverse=True)
    leak = next(v for v in doc["levers"] if v["kind"] == "leak")
    assert "fix the leak held by TinyGPT.leak_store (list)" in leak["action"] and leak["freed_bytes"] > 8 * MiB
    # The demo's whole leak is that list: what fixing it frees is what it holds, and then nothing grows.
    assert leak["freed_bytes"] == top["bytes"] and "once fixed nothing else grows: the job runs on" in leak["action"]
    print(f"inspect took {took:.2f} s:\n{inspect.stdout[: inspect.stdout.find('Growing')]}")
    assert inspect.returncode == 0, inspect.stderr
    assert "What would fit" in inspect.stdout and "fix the leak held by TinyGPT.leak_store (list)" in inspect.stdout
    assert inspect.stdout.index("What would fit") < inspect.stdout.index("Growing")
    assert took < 2.0


def test_a_healthy_demo_shows_no_growth(tmp_path: Path) -> None:
    port = free_port()
    env = debug_env(tmp_path, MEMEXPORTER_CENSUS_EVERY="10", MEMEXPORTER_CENSUS_BUDGET="1")
    with running_demo(port, *TINY, "--eval-every", "25", env=env):
        doc = until(port, lambda d: len(d["history"]) >= 10)
    print(f"healthy demo: {len(doc['history'])} censuses up to step {doc['census']['step']}, growth {doc['growth']}")
    assert doc["growth"] == [] and doc["autograd"] == []
    kinds = {k["kind"] for k in doc["census"]["by_kind"]}
    assert {"parameter", "gradient", "optimizer_state"} <= kinds


PREMORTEM_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import psutil, torch
    import memexporter

    # A budget 600 MiB above what the job holds now, and 8 MiB more kept every step.
    limit = psutil.Process().memory_info().rss + 600 * 2**20
    memexporter.start(port=0, addr="127.0.0.1", oom_dump_dir=sys.argv[1], memory_limit_bytes=limit, warmup_steps=5)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for step in range(100000):
        model(torch.randn(4, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
        if len(kept) < 70:  # stays under the budget: the pre-mortem comes first, the OOM never
            kept.append(torch.ones(2 * 2**20))
        time.sleep(0.02)
    """
)


def test_the_premortem_is_on_disk_before_the_oom_and_survives_sigkill(tmp_path: Path) -> None:
    script, dumps = tmp_path / "job.py", tmp_path / "dumps"
    script.write_text(PREMORTEM_SCRIPT)
    proc = forkserver.popen(  # forked: its budget is set from its own RSS, and SIGKILL ends it as any process
        [sys.executable, str(script), str(dumps)],
        env=module_env(),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        scripts=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (dumps.is_dir() and any(dumps.iterdir())):
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "no pre-mortem within 180 s"
            time.sleep(0.2)
        time.sleep(3)  # more steps, more watch ticks: it is written once
        os.killpg(proc.pid, signal.SIGKILL)  # what the OOM killer sends
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    files = sorted(dumps.iterdir())
    assert [f.name for f in files] == [f"memexporter-premortem-rank0-pid{proc.pid}.json"]
    doc = json.loads(files[0].read_text())
    print(f"pre-mortem at step {doc['census']['step']}: {doc['reason']}")
    assert re.match(r"cpu: (OOM ETA \d+ s|[\d.]+ % of the limit committed)", doc["reason"])
    leak = next(g for g in doc["census"]["groups"] if g["shape"] == [2097152])
    assert leak["count"] >= 5 and doc["oom"]["cpu"]["limit_bytes"] > 0
    # The job is gone: inspect reads what it left (the folder: its newest dump).
    inspect = subprocess.run(
        [sys.executable, "-m", "memexporter", "inspect", str(dumps)],
        capture_output=True,
        text=True,
        timeout=60,
        env=module_env(),
        check=False,
    )
    assert inspect.returncode == 0, inspect.stderr
    assert f"why: {doc['reason']}" in inspect.stdout and "float32[2097152]" in inspect.stdout
    # What would fit, as the job last knew it: its model is not tracked, so the row levers say how to see them.
    assert {v["kind"] for v in doc["levers"]} >= {"checkpointing", "sharding", "precision"}, doc["levers"]
    assert "What would fit" in inspect.stdout and "track() the model to see this" in inspect.stdout
