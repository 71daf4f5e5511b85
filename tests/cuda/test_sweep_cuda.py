"""`memexporter sweep` on a real GPU: the demo's reserved and allocated peaks, and a real CUDA OOM.

Skipped with a reason where torch sees no CUDA device (see conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.demo import module_env

GiB = 1 << 30
# A 1.5 GiB cap through the allocator's own per-process fraction: a real OutOfMemoryError at a
# known size on any card, and the OOM view's limit follows the cap.
CAPPED = textwrap.dedent(
    """
    import sys, time, torch
    torch.cuda.set_per_process_memory_fraction(min(1.0, 1.5 * 2**30 / torch.cuda.get_device_properties(0).total_memory))
    batch = int(sys.argv[1])
    model = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    held = []
    try:
        for _ in range(batch):
            held.append(torch.ones(64 << 20, device="cuda"))  # 256 MiB each
    except torch.OutOfMemoryError:
        held.clear()  # caught, as a script that retries smaller would: the allocator still counts it
        print("batch too large, going on without it", file=sys.stderr)
    for _ in range(100_000):
        model(torch.randn(2, 4, device="cuda")).sum().backward()
        opt.step()
        time.sleep(0.05)
    """
)


def sweep(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "sweep.json"
    proc = subprocess.run(
        [sys.executable, "-m", "memexporter", "sweep", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=module_env(),
        cwd=tmp_path,
        check=False,
    )
    assert out.exists(), proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def test_a_sweep_of_the_demo_on_the_gpu(tmp_path: Path) -> None:
    proc, doc = sweep(
        tmp_path,
        "--grid",
        "batch=8,32",
        "--steps",
        "5",
        "--",
        "memexporter",
        "demo",
        "--device",
        "cuda",
        "--batch",
        "{batch}",
        "--steps",
        "100",
    )
    assert proc.returncode == 0, proc.stderr
    small, large = doc["runs"]
    for run in (small, large):
        assert run["device"].startswith("cuda:") and run["status"] == "ok" and run["fits"] is True
        # The peak is the reserved high-water mark: never below the allocated one.
        assert run["peak_bytes"] == run["peak_reserved_bytes"] >= run["peak_allocated_bytes"] > 0
        assert run["limit_bytes"] > run["peak_bytes"]  # the device's limit, as the OOM view sees it
        assert run["split_bytes"]["parameters"] > 0
    assert large["peak_allocated_bytes"] > small["peak_allocated_bytes"]
    assert large["split_bytes"]["activations"] > 3 * small["split_bytes"]["activations"]
    assert "alloc peak" in proc.stdout.splitlines()[0]


def test_a_caught_cuda_oom_is_an_oom_and_larger_sizes_are_skipped(tmp_path: Path) -> None:
    script = tmp_path / "capped.py"
    script.write_text(CAPPED)
    proc, doc = sweep(
        tmp_path, "--grid", "batch=1,2,8,16", "--steps", "3", "--", sys.executable, str(script), "{batch}"
    )
    assert proc.returncode == 0, proc.stderr
    runs = {r["params"]["batch"]: r for r in doc["runs"]}
    assert runs[1]["fits"] and runs[2]["fits"]
    assert runs[2]["peak_allocated_bytes"] - runs[1]["peak_allocated_bytes"] == pytest.approx(256 << 20, rel=0.05)
    assert runs[8]["oom"] and "memexporter_allocator_ooms_total" in runs[8]["oom_reason"]
    assert runs[16]["skipped"] and runs[16]["skipped_because"] == {"batch": 8}
    assert runs[1]["limit_bytes"] == pytest.approx(1.5 * GiB, rel=0.01)  # the fraction caps the OOM view's limit
