"""Record a variable-length job through a real CUDA OOM on its longest batch, with the exporter watching (a GPU only).

    python -m tests.cuda.record_lengths [--out DIR] [--batch 8] [--train-steps 300]

Issue 41's GPU truth. The demo's GPT (``memexporter.cli.demo.TinyGPT``, wider: ``--d-model``) trains at
lengths drawn from ``--min-len`` to ``--max-len`` with the exporter started and the model tracked (its
forward measures each step's input). Then the memory fraction is set so that the limit is
``--headroom`` times the committed peak so far, and the exporter's answer is read BEFORE any longer
batch: the capacity (``memexporter_input_capacity_elements``), bytes per element, its line, and whether
``on_oom_risk`` fired for the declared maximum (``max_input_elements``: ``--batch`` x ``--long-len``).
Then the lengths grow by ``GROWTH`` a step from ``--max-len`` until ``torch.OutOfMemoryError``: the
longest that ran and the one that died bound the true capacity. After every step it records
``torch.cuda.memory_stats()`` (the columns of ``tests/fixtures/recorded/traces/``) and the step's input
(``input_elements``, ``input_length``, ``input_batch``) and the bytes allocated at its forward's end
(``forward_allocated``: where the exporter samples a detailed step), so ``tests/support/replay.py`` replays the file
through the input log too. Writes ``trace-lengths-native.json`` and prints ``[lengths]`` lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

from tests.cuda.record_traces import COLUMNS, REPO, _Said

GROWTH = 1.25
INPUT_COLUMNS = ["input_elements", "input_length", "input_batch", "forward_allocated"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch import nn

    import memexporter
    from memexporter.cli.demo import TinyGPT

    said = _Said()
    logging.getLogger("memexporter").addHandler(said)
    torch.cuda.init()
    declared = args.batch * args.long_len
    exp = memexporter.start(http=False, max_input_elements=declared, oom_dump_dir=str(args.out / "dumps-lengths"))
    fired: list[tuple[float, str]] = []
    memexporter.on_oom_risk(lambda risk: fired.append((time.perf_counter(), risk.describe())))
    torch.manual_seed(0)
    model = TinyGPT(d_model=args.d_model, layers=args.layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    memexporter.track(model, opt)
    loss_fn = nn.CrossEntropyLoss()
    rows: list[list[float]] = []
    t0 = time.perf_counter()

    def step(n: int, length: int) -> None:
        tokens = torch.randint(0, 512, (args.batch, length + 1), device="cuda")
        loss = loss_fn(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        forward = torch.cuda.memory_stats(0)["allocated_bytes.all.current"]  # where a tracked forward samples
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()  # the recording's own measurement, not the exporter's
        stats = torch.cuda.memory_stats(0)
        rows.append([round(time.perf_counter() - t0, 4), n, *(int(stats.get(c, 0)) for c in COLUMNS[2:])])
        rows[-1] += [args.batch * length, length, args.batch, forward]

    def read(name: str, device: bool = True) -> float | None:
        labels = {"rank": exp.sources.rank, **({"device": "cuda:0"} if device else {})}
        return exp.registry.get_sample_value(f"memexporter_{name}", labels)

    rng = random.Random(0)
    for n in range(args.train_steps):
        step(n, rng.randint(args.min_len, args.max_len))
    peak = max(r[COLUMNS.index("allocated_bytes.all.peak")] for r in rows)
    total = torch.cuda.get_device_properties(0).total_memory
    limit = int(args.headroom * peak)
    torch.cuda.set_per_process_memory_fraction((limit + 0.5) / total, 0)
    for n in range(args.train_steps, args.train_steps + 40):  # the same mix under the limit: judged, scraped
        step(n, rng.randint(args.min_len, args.max_len))
        time.sleep(0.05)
    before = {
        "t": rows[-1][0],
        "capacity_elements": read("input_capacity_elements"),
        "bytes_per_element": read("input_bytes_per_element"),
        "largest_seen_elements": read("step_input_elements_max", device=False),
        "limit_bytes": read("memory_limit_bytes"),
        "on_oom_risk_before": [text for _, text in fired],
    }
    length, ran, oom = args.max_len, args.max_len, ""
    try:
        while True:
            length = int(length * GROWTH) + 1
            step(len(rows), length)
            ran = length
    except torch.OutOfMemoryError as exc:
        oom = str(exc).splitlines()[0]
    exp.stop()
    return {
        "probe": "trace",
        "alloc_conf": "backend:native",
        "device": "cuda:0",
        "limit_bytes": limit,
        "leak_mib_per_step": 0,
        "columns": COLUMNS + INPUT_COLUMNS,
        "rows": rows,
        "oom": oom,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "recorded_by": "tests/cuda/record_lengths.py, with memexporter watching",
        "exporter": {
            "limit_from_step": args.train_steps,  # the first row under the limit (h200_traces.Trace)
            "predicted_before_the_long_batches": before,
            "declared_max_elements": declared,
            "longest_that_ran": {"length": ran, "elements": args.batch * ran},
            "died_at": {"length": length, "elements": args.batch * length},
            "risk_fired_s": [round(t - t0, 3) for t, _ in fired],
            "said": [line for line in said.lines if "OOM" in line or "input" in line],
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "gpu-check" / "traces")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--long-len", type=int, default=8192, help="the declared longest length (max_input_elements)")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--headroom", type=float, default=2.5, help="the limit, over the committed peak of training")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = run(args)
    path = args.out / "trace-lengths-native.json"
    path.write_text(json.dumps(doc, separators=(",", ":"), allow_nan=True) + "\n")
    ex = doc["exporter"]
    before, ran, died = ex["predicted_before_the_long_batches"], ex["longest_that_ran"], ex["died_at"]
    cap = before["capacity_elements"]
    truth = f"between {ran['elements']:,} and {died['elements']:,} elements (length {ran['length']} ran, {died['length']} died)"
    error = f"{cap / ran['elements'] - 1:+.1%} against the longest that ran" if cap else "no capacity claimed"
    print(f"[lengths] capacity predicted before the long batches: {cap} elements; truth {truth}; {error}")
    print(f"[lengths] on_oom_risk before them: {before['on_oom_risk_before'] or 'never'}; OOM: {doc['oom'][:80]}")
    for line in ex["said"]:
        print(f"[lengths] said: {line}")
    print(f"[lengths] trace: {path}", flush=True)
    return 0 if doc["oom"] else 1


if __name__ == "__main__":
    sys.exit(main())
