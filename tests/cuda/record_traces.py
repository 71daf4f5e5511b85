"""Record per-step allocator traces through a real CUDA OOM, with the exporter watching (a GPU only).

    python -m tests.cuda.record_traces [--out DIR] [--backend native|expandable|async ...] [--leak-mib 8]

Each backend runs in its own process (the allocator settings are read once, when CUDA starts): a
6 x Linear(1024) model under AdamW, capped at a 6 GiB ``set_per_process_memory_fraction``, keeps an
``--leak-mib`` tensor every step until ``torch.OutOfMemoryError``. After every step it records
``torch.cuda.memory_stats()`` (the columns of ``tests/fixtures/recorded/traces/``, so
``tests/support/replay.py`` replays the file) and, every ``READ_EVERY`` steps, what the exporter
running in the same process said (``memory_committed_bytes``, the limit, the leak, the ETA), when its
``on_oom_risk`` callback ran, and the OOM message it logged. Writes ``trace-<backend>-<N>mib.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MiB, GiB = 1 << 20, 1 << 30
CONF = {"native": "backend:native", "expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}
COLUMNS = [
    "t",
    "step",
    "allocated_bytes.all.current",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "requested_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.peak",
    "segment.all.current",
    "segment.large_pool.current",
    "segment.small_pool.current",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
]
READ_EVERY = 10
LIMIT = 6 * GiB
MAX_STEPS = 5000


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def child(backend: str, leak_mib: int, out: Path, step_seconds: float) -> None:
    import torch

    import memexporter

    said = _Said()
    logging.getLogger("memexporter").addHandler(said)
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((LIMIT + 0.5) / total, 0)
    exp = memexporter.start(http=False, warmup_steps=20, oom_dump_dir=str(out.parent / f"dumps-{backend}"))
    fired: list[float] = []
    memexporter.on_oom_risk(lambda risk: fired.append(time.perf_counter()))
    layers = [torch.nn.Linear(1024, 1024) for _ in range(6)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.GELU())]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    kept, rows, readings, oom = [], [], [], ""
    t0 = time.perf_counter()

    def read(name: str) -> float | None:
        return exp.registry.get_sample_value(f"memexporter_{name}", {"rank": exp.sources.rank, "device": "cuda:0"})

    try:
        for step in range(MAX_STEPS):
            started = time.perf_counter()
            model(torch.randn(256, 1024, device="cuda")).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            kept.append(torch.ones(leak_mib * MiB // 4, device="cuda"))
            torch.cuda.synchronize()  # the recording's own measurement, not the exporter's
            stats = torch.cuda.memory_stats(0)
            rows.append([round(time.perf_counter() - t0, 4), step, *(int(stats.get(c, 0)) for c in COLUMNS[2:])])
            if step % READ_EVERY == 0:
                names = ("memory_used_bytes", "memory_committed_bytes", "memory_limit_bytes", "oom_eta_seconds")
                readings.append({"t": rows[-1][0], "step": step, **{n: read(n) for n in names}})
                readings[-1]["leak_bytes_per_step"] = read("leak_bytes_per_step")
            # The rest of a real step (data loading, logging): the H200 traces' jobs ran ~30 steps/s;
            # at this model's own 4 ms a step the job would die 2.4 s in, before any judgement.
            time.sleep(max(0.0, step_seconds - (time.perf_counter() - started)))
    except torch.OutOfMemoryError as exc:
        oom = str(exc).splitlines()[0]
    oom_t = time.perf_counter() - t0
    after = torch.cuda.memory_stats(0)
    doc: dict[str, Any] = {
        "probe": "trace",
        "alloc_conf": CONF[backend],
        "device": "cuda:0",
        "limit_bytes": LIMIT,
        "leak_mib_per_step": leak_mib,
        "columns": COLUMNS,
        "rows": rows,
        "oom": oom,
        "after_oom": {c: int(after.get(c, 0)) for c in COLUMNS[2:]},
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "recorded_by": "tests/cuda/record_traces.py, with memexporter watching",
        "exporter": {
            "oom_after_s": round(oom_t, 3),
            "risk_fired_s": [round(t - t0, 3) for t in fired],
            "readings": readings,
            "said": [line for line in said.lines if "OOM" in line or "expandable" in line],
        },
    }
    out.write_text(json.dumps(doc, indent=None, separators=(",", ":"), allow_nan=True) + "\n")
    exp.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "gpu-check" / "traces")
    ap.add_argument("--backend", action="append", choices=sorted(CONF), help="repeatable; default: all three")
    ap.add_argument("--leak-mib", type=int, default=8)
    ap.add_argument("--step-seconds", type=float, default=0.033, help="pace each step to this long (default: ~30/s)")
    ap.add_argument("--child", choices=sorted(CONF), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args.child, args.leak_mib, args.out / f"trace-{args.child}-{args.leak_mib}mib.json", args.step_seconds)
        return 0
    failed = 0
    for backend in args.backend or ["native", "expandable", "async"]:
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": CONF[backend], "PYTHONPATH": str(REPO)}
        env.pop("PYTORCH_ALLOC_CONF", None)
        cmd = [sys.executable, "-m", "tests.cuda.record_traces", "--child", backend, "--leak-mib", str(args.leak_mib)]
        cmd += ["--step-seconds", str(args.step_seconds)]
        result = subprocess.run([*cmd, "--out", str(args.out)], env=env, cwd=REPO, check=False)
        path = args.out / f"trace-{backend}-{args.leak_mib}mib.json"
        if result.returncode != 0 or not path.is_file():
            print(f"[traces] {backend}: FAILED (exit {result.returncode})", flush=True)
            failed += 1
            continue
        doc = json.loads(path.read_text())
        ex = doc["exporter"]
        lead = f"{ex['oom_after_s'] - ex['risk_fired_s'][0]:.2f} s" if ex["risk_fired_s"] else "never"
        print(
            f"[traces] {backend}: {len(doc['rows'])} steps, OOM after {ex['oom_after_s']:.1f} s "
            f"({doc['oom'][:60]}...); on_oom_risk {lead} ahead; {path}",
            flush=True,
        )
        for line in ex["said"]:
            print(f"[traces] {backend} said: {line}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
