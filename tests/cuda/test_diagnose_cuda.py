"""The diagnosis on a real GPU: the census of CUDA tensors against the allocator, /debug/snapshot
as a pickle that PyTorch's memory_viz tools open, allocation history (stack traces), and the OOM
dump written by the allocator's OOM observer. Skipped with a reason without a GPU (conftest).

History and the OOM observer are process-wide and cannot be undone, so those cases run in a
child process."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
import torch
from torch.cuda import _memory_viz

import memexporter
from memexporter.diagnose import census
from tests.support import REPO_ROOT
from tests.support.demo import module_env

MiB = 1 << 20


pytestmark = pytest.mark.usefixtures("no_exporter")  # tests/support/fixtures.py


def test_census_of_cuda_tensors_matches_the_allocator() -> None:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 1024, device="cuda")).sum().backward()
    opt.step()
    kept = [torch.ones(3, 1 << 18, device="cuda") for _ in range(3)]
    c = census.take(1, None).census
    rows = {(g.shape, g.kind): g for g in c.groups if g.device == "cuda:0"}
    assert rows[((4096, 1024), "parameter")].bytes == 4096 * 1024 * 4
    assert rows[((4096, 1024), "gradient")].bytes == 4096 * 1024 * 4
    assert rows[((4096, 1024), "optimizer_state")].count == 2
    assert rows[((3, 1 << 18), "other")].count == 3
    ours = sum(g.bytes for g in c.groups if g.device == "cuda:0")
    grew = torch.cuda.memory_allocated(0) - before
    # The allocator rounds each block up to 512 bytes; nothing else on the device is ours.
    assert ours <= torch.cuda.memory_allocated(0) and grew <= ours + 512 * len(rows) * 4 + 8 * MiB
    del kept


def test_snapshot_endpoint_serves_a_memory_viz_pickle() -> None:
    x = torch.ones(16 * MiB // 4, device="cuda")
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    assert exp.diagnostics is not None and exp.diagnostics.token is not None
    req = urllib.request.Request(
        f"http://127.0.0.1:{exp.port}/debug/snapshot",
        headers={"Authorization": f"Bearer {exp.diagnostics.token.value}"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"] == "application/octet-stream"
        snapshot = pickle.loads(r.read())
    sizes = [b["size"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert any(size >= 16 * MiB for size in sizes)
    assert "<html" in _memory_viz.segment_plot(snapshot).lower()
    del x


CHILD = textwrap.dedent(
    """
    import json, os, sys, torch, memexporter
    dump = sys.argv[1]
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, record_history=True, oom_dump_dir=dump)
    model = torch.nn.Linear(256, 256).cuda()           # CUDA starts after start(): set up at the next step
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 256, device="cuda")).sum().backward()
    opt.step()                                          # a step boundary: history and observer go on
    def allocate_here():
        return torch.ones(4 * 2**20, device="cuda")
    kept = allocate_here()
    snap = torch.cuda.memory._snapshot()
    frames = [f["name"] for s in snap["segments"] for b in s["blocks"] for f in b.get("frames", [])]
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: an OOM on any GPU
    except torch.cuda.OutOfMemoryError:
        pass
    print(json.dumps({"frames": frames, "files": sorted(os.listdir(dump))}))
    """
)


def test_history_carries_stack_traces_and_an_oom_writes_the_dump(tmp_path: Path) -> None:
    script, dump = tmp_path / "child.py", tmp_path / "dumps"
    script.write_text(CHILD)
    out = subprocess.run(
        [sys.executable, str(script), str(dump)],
        capture_output=True,
        text=True,
        timeout=300,
        env=module_env({"MEMEXPORTER_STRICT": "0"}),
        cwd=REPO_ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "allocate_here" in result["frames"]
    stems = sorted({f.rsplit(".", 1)[0] for f in result["files"]})
    assert len(stems) == 1 and stems[0].startswith("memexporter-oom-rank0-pid")
    snapshot = pickle.loads((dump / (stems[0] + ".pickle")).read_bytes())
    actions = [e["action"] for trace in snapshot["device_traces"] for e in trace]
    assert "oom" in actions
    doc = json.loads((dump / (stems[0] + ".json")).read_text())
    # The ask (1 PiB) is more than the device holds at all: the message says so, with what was held.
    assert doc["reason"].startswith("CUDA OOM: asked 1024.0 TiB: more than the whole "), doc["reason"]
    assert "limit (device memory) of cuda:0: " in doc["reason"] and " allocated" in doc["reason"]
    assert "CUDA OOM: asked 1024.0 TiB" in out.stderr
