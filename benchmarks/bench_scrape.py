"""What one scrape costs: the collectors alone, the full HTTP round trip, and under concurrency.

Runs a small real model with the exporter started and 0 or ~100 tracked modules, then times
``registry.collect()`` and ``GET /metrics`` on loopback. Prints p50/p99 in microseconds. Then
``--concurrency`` scrapers in another process (benchmarks/scraper.py, as Prometheus would be)
GET /metrics back to back for ``--seconds``: latency p50/p99/max, scrapes per second (the
server's queueing shows) and the exporter process's CPU time per scrape (what one scrape a
second costs a training job at most, in a way a busy machine does not blur). On a GPU machine the same script measures the CUDA path.

    python benchmarks/bench_scrape.py [--scrapes 300] [--concurrency 20 --seconds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

import memexporter


def model_with_modules(blocks: int, device: str) -> nn.Module:
    # Each block is 4 modules (Sequential, Linear, GELU, Linear): blocks=25 gives ~100 modules.
    return nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)) for _ in range(blocks))).to(
        device
    )


def percentiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1e6, xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1e6


def measure(blocks: int, track: bool, scrapes: int, device: str) -> dict[str, tuple[float, float]]:
    memexporter.stop()
    model = model_with_modules(blocks, device)
    opt = torch.optim.AdamW(model.parameters())
    exp = memexporter.start(port=0, addr="127.0.0.1", warmup_steps=0)
    handle = memexporter.track(model, opt, depth=3, max_modules=200) if track else None
    for _ in range(40):  # fill the trend window so the estimate runs at full size
        model(torch.randn(32, 64, device=device)).sum().backward()
        opt.step()
        opt.zero_grad()
    rows = sum(1 for f in exp.registry.collect() for s in f.samples if s.name == "memexporter_module_parameter_bytes")
    collect, http = [], []
    url = exp.url or ""
    for _ in range(scrapes):
        t0 = time.perf_counter()
        list(exp.registry.collect())
        collect.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        urllib.request.urlopen(url, timeout=10).read()
        http.append(time.perf_counter() - t0)
    if handle is not None:
        handle.remove()
    exp.stop()
    return {"rows": (rows, rows), "collect": percentiles(collect), "http": percentiles(http)}


def concurrent(scrapers: int, seconds: float, device: str) -> dict[str, float]:
    """Latency of GET /metrics (100 tracked modules) with ``scrapers`` clients at once."""
    memexporter.stop()
    model = model_with_modules(25, device)
    opt = torch.optim.AdamW(model.parameters())
    exp = memexporter.start(port=0, addr="127.0.0.1", warmup_steps=0)
    handle = memexporter.track(model, opt, depth=3, max_modules=200)
    for _ in range(40):
        model(torch.randn(32, 64, device=device)).sum().backward()
        opt.step()
        opt.zero_grad()
    scraper = Path(__file__).with_name("scraper.py")
    cpu0 = time.process_time()  # this process: the exporter's threads serving the scrapes, nothing else
    out = subprocess.run(
        [
            sys.executable,
            str(scraper),
            "concurrent",
            exp.url or "",
            "--scrapers",
            str(scrapers),
            "--seconds",
            str(seconds),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    cpu = time.process_time() - cpu0
    handle.remove()
    exp.stop()
    result = json.loads(out.stdout)
    xs = sorted(result["latencies"])
    return {
        "p50": statistics.median(xs),
        "p99": xs[min(len(xs) - 1, int(0.99 * len(xs)))],
        "max": xs[-1],
        "rate": result["rate"],
        "errors": result["errors"],
        "n": len(xs),
        "cpu": cpu / max(1, len(xs)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--concurrency", type=int, default=20, help="concurrent scrapers (0: skip)")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long the concurrent scrapers run")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"scrape cost on {name}, torch {torch.__version__}, {args.scrapes} scrapes each")
    print(f"{'tracked modules':>16} | {'collect p50':>11} | {'collect p99':>11} | {'HTTP p50':>9} | {'HTTP p99':>9}")
    for track in (False, True):
        r = measure(25, track, args.scrapes, args.device)
        print(
            f"{r['rows'][0]:>16.0f} | {r['collect'][0]:>9.0f}us | {r['collect'][1]:>9.0f}us | "
            f"{r['http'][0]:>7.0f}us | {r['http'][1]:>7.0f}us"
        )
    if args.concurrency:
        c = concurrent(args.concurrency, args.seconds, args.device)
        print(
            f"{args.concurrency} concurrent scrapers for {args.seconds:g} s (100 tracked modules): "
            f"p50 {c['p50'] * 1e3:.1f} ms, p99 {c['p99'] * 1e3:.1f} ms, max {c['max'] * 1e3:.1f} ms, "
            f"{c['rate']:.0f} scrapes/s, {c['n']:.0f} scrapes, {c['errors']:.0f} errors; "
            f"exporter CPU {c['cpu'] * 1e3:.2f} ms per scrape"
        )


if __name__ == "__main__":
    main()
