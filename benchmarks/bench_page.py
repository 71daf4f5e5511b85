"""What an open live page costs the training loop: step time with a page refreshing, against none.

The job (this process) trains a small GPT on CPU (``bench_overhead.GPT``, 1 torch thread) with
memexporter started. A client process (this script with ``--client PORT INTERVAL``) acts as the
open page: it loads ``/`` once, then GETs ``/live.json`` every INTERVAL seconds (the page refreshes
every 5 s; ``--intervals 5,0.5`` also measures ten times that, as ten open tabs would). The loop
trains in alternating blocks of about ``--block`` seconds, page on and page off, for ``--rounds``
rounds (the order flips every round). Reported per interval: median wall step time with and
without the page, their ratio, and the median of the per-round ratios (paired: least disturbed by
drift), plus the median time the server took to answer ``/live.json``.

    python benchmarks/bench_page.py [--rounds 12 --block 2.0 --intervals 5,0.5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def client(port: int, interval: float) -> None:
    """The open page: ``/`` once, then ``/live.json`` every ``interval`` s while stdin says "on"."""
    base, on, took = f"http://127.0.0.1:{port}", threading.Event(), []

    def commands() -> None:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "on":
                on.set()
            elif cmd == "off":
                on.clear()
            elif cmd == "report":
                print(statistics.median(took) * 1000 if took else float("nan"), flush=True)

    threading.Thread(target=commands, daemon=True).start()
    urllib.request.urlopen(base + "/", timeout=10).read()
    while True:
        on.wait()
        t0 = time.perf_counter()
        urllib.request.urlopen(base + "/live.json", timeout=10).read()
        took.append(time.perf_counter() - t0)
        time.sleep(max(0.0, interval - (time.perf_counter() - t0)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--client", nargs=2, metavar=("PORT", "INTERVAL"), help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--block", type=float, default=2.0, help="seconds of training per block")
    p.add_argument("--intervals", default="5,0.5", help="seconds between /live.json requests, comma-separated")
    args = p.parse_args()
    if args.client is not None:
        client(int(args.client[0]), float(args.client[1]))
        return

    import torch
    import torch.nn.functional as F

    import memexporter
    from benchmarks.bench_overhead import GPT, steps_per_block

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(d=128, layers=2, heads=4, ctx=64)
    opt = torch.optim.AdamW(model.parameters())
    memexporter.track(model, opt)  # the page shows the module rows: their cost is in each answer
    x, y = torch.randint(0, 512, (8, 64)), torch.randint(0, 512, (8, 64))

    def step() -> None:
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    exp = memexporter.start(port=0, addr="127.0.0.1")
    per_block = steps_per_block(step, args.block)
    print(
        f"{os.cpu_count()} CPUs, GPT layers=2 d=128, 1 torch thread, {args.rounds} rounds x {per_block} steps a block"
    )
    print("| /live.json every | step, no page | step, page open | ratio | paired ratio | answer |")
    print("|---|---|---|---|---|---|")
    for interval in (float(s) for s in args.intervals.split(",")):
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--client", str(exp.port), str(interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        times: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(args.rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                proc.stdin.write(mode + "\n")
                proc.stdin.flush()
                step()
                w0 = time.perf_counter()
                for _ in range(per_block):
                    step()
                times[mode].append((time.perf_counter() - w0) / per_block)
        proc.stdin.write("off\nreport\n")
        proc.stdin.flush()
        answer_ms = float(proc.stdout.readline())
        proc.kill()
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        paired = statistics.median(b / a for a, b in zip(times["off"], times["on"], strict=True))
        print(
            f"| {interval:g} s | {off * 1000:.1f} ms | {on * 1000:.1f} ms | x{on / off:.3f} | x{paired:.3f} | "
            f"{answer_ms:.1f} ms |"
        )
    exp.stop()


if __name__ == "__main__":
    main()
