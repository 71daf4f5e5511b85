"""What a request flood costs the training loop: the exporter's CPU budget, measured.

The job (this process) trains a small GPT on CPU with memexporter started (``debug=True``, so
``/debug/memory`` exists). A client process (this script with ``--client``) runs 4 threads that
send valid requests to one endpoint as fast as they can, one connection each (the server closes
after every answer), plus one Prometheus-like scraper that GETs ``/metrics`` once a second all
along (Prometheus' own Accept and Accept-Encoding) and checks that ``memexporter_steps_total``
advanced since its previous scrape.

For each endpoint the loop trains in alternating blocks of about ``--block`` seconds, flood on and
flood off, for ``--rounds`` rounds. Reported per endpoint: the median step (wall clock, and the
training thread's CPU time), the ratio of medians and the median of the per-round ratios
("paired", least disturbed by drift). Wall time is the figure that matters: a flood steals it
through the GIL and the shared core, not the training thread's CPU time. ``--pin on``: the job on
CPU 0 and the client on CPU 1 (``os.sched_setaffinity``, every thread); ``off``: unpinned.
The last column: the flood's answers a second by status (429: refused), and how many of the
scrapes made during the flood were fresh (200, ``steps_total`` advanced, answered within 1 s).

On a 2-core Xeon box with a load near 1 (12 rounds): before the server had a CPU budget, wall
step time x4.8 to x5.7 pinned and x2.7 to x3.1 unpinned; with it, x1.00 to x1.04 on every
endpoint, pinned or not, every 1 s scrape fresh.

    python benchmarks/bench_flood.py [--pin both|on|off] [--rounds 12 --block 1.0]
    python benchmarks/bench_flood.py --endpoints /metrics,/healthz --rounds 12

Runs against whatever memexporter is importable, so the same command measures an older checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import socket
import statistics
import sys
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.scraper import Client  # after the path: run as a script

FLOOD_THREADS = 4
PROMETHEUS_ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
STEPS = re.compile(rb"^memexporter_steps_total\{[^}]*\} (\S+)", re.M)
TOKEN = "bench-flood-debug-token-0123456789"  # /debug/* asks for one (where the checkout has tokens)


def pin(cpus: set[int]) -> None:
    """Every thread of this process (and those it starts later) on ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


# --- the client process ------------------------------------------------------------------------


def client(port: int) -> None:
    state: dict[str, Any] = {"path": None, "flood": Counter(), "scrapes": []}
    on, lock = threading.Event(), threading.Lock()

    def flood() -> None:
        while True:
            on.wait()
            request = (
                f"GET {state['path']} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
                f"Authorization: Bearer {TOKEN}\r\n\r\n"
            ).encode()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(request)
                    first, reply = s.recv(65536), b""
                    while chunk := s.recv(65536):
                        reply += chunk
                outcome = first[9:12].decode() or "empty"
            except OSError as exc:
                outcome = type(exc).__name__
            with lock:
                state["flood"][outcome] += 1

    def scrape() -> None:  # as Prometheus with scrape_interval: 1s
        last, next_at = None, time.monotonic()
        while True:
            next_at += 1.0
            during, t0, status, advanced = on.is_set(), time.monotonic(), 0, False
            try:
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
                )
                with urllib.request.urlopen(req, timeout=10) as r:
                    body, status = r.read(), r.status
                    if r.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                found = STEPS.search(body)
                value = float(found.group(1)) if found else None
                advanced = last is not None and value is not None and value > last
                last = value if value is not None else last
            except OSError as exc:
                status = getattr(exc, "code", -1)
            with lock:
                state["scrapes"].append((during, status, time.monotonic() - t0, advanced))
            time.sleep(max(0.0, next_at - time.monotonic()))

    for target in [flood] * FLOOD_THREADS + [scrape]:
        threading.Thread(target=target, daemon=True).start()
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "flood":
            state["path"] = arg
            on.set()
        elif cmd == "quiet":
            on.clear()
        elif cmd == "pin":
            pin({int(arg)} if arg != "all" else set(range(os.cpu_count() or 1)))
        elif cmd == "report":
            with lock:
                report = {"flood": dict(state["flood"]), "scrapes": state["scrapes"]}
                state["flood"], state["scrapes"] = Counter(), []
            print(json.dumps(report), flush=True)


# --- the job -----------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--client", type=int, help=argparse.SUPPRESS)
    p.add_argument("--endpoints", default="/metrics,/healthz,/debug/memory,/")
    p.add_argument("--pin", choices=["on", "off", "both"], default="both")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--block", type=float, default=1.0, help="seconds per block")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d", type=int, default=128)
    args = p.parse_args()
    if args.client is not None:
        client(args.client)
        return

    import torch
    import torch.nn.functional as F

    import memexporter
    from benchmarks.bench_overhead import GPT, steps_per_block

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(d=args.d, layers=args.layers, heads=4, ctx=64)
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randint(0, 512, (8, 64)), torch.randint(0, 512, (8, 64))

    def step() -> None:
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    os.environ["MEMEXPORTER_DEBUG_TOKEN"] = TOKEN
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    flooder = Client(__file__, exp.port)
    tell = flooder.tell

    per_block = steps_per_block(step, args.block)

    def block() -> tuple[float, float]:
        step()  # the switch settles
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(per_block):
            step()
        return (time.perf_counter() - w0) / per_block, (time.thread_time() - c0) / per_block

    cpus = sorted(os.sched_getaffinity(0))
    modes = ["on", "off"] if args.pin == "both" else [args.pin]
    if len(cpus) < 2 and "on" in modes:
        print("one CPU only: no pinned runs")
        modes.remove("on")
    print(
        f"{os.cpu_count()} CPUs ({len(cpus)} usable), GPT layers={args.layers} d={args.d}, 1 torch thread, "
        f"{args.rounds} rounds x {per_block} steps per block, flood: {FLOOD_THREADS} threads, 1 process"
    )
    for mode in modes:
        pin({cpus[0]} if mode == "on" else set(cpus))
        tell(f"pin {cpus[1]}" if mode == "on" else "pin all")
        print(f"pinned: job on CPU {cpus[0]}, client on CPU {cpus[1]}" if mode == "on" else "pinned: no")
        for path in args.endpoints.split(","):
            times: dict[str, list[tuple[float, float]]] = {"quiet": [], "flood": []}
            tell("report")
            flooder.answer()
            flood_s = 0.0
            for r in range(args.rounds):
                for name in ("quiet", "flood") if r % 2 == 0 else ("flood", "quiet"):
                    tell(f"flood {path}" if name == "flood" else "quiet")
                    started = time.monotonic()
                    times[name].append(block())
                    flood_s += (time.monotonic() - started) if name == "flood" else 0.0
            tell("quiet")
            tell("report")
            report = json.loads(flooder.answer())
            print(summary(path, times, report, flood_s))
    flooder.close()
    exp.stop()


def summary(path: str, times: dict[str, list[tuple[float, float]]], report: dict[str, Any], flood_s: float) -> str:
    parts = [f"{path:<14}"]
    for i, clock in enumerate(("wall", "thread")):
        quiet, flood = ([t[i] for t in times[k]] for k in ("quiet", "flood"))
        paired = statistics.median(f / q for f, q in zip(flood, quiet, strict=True))
        parts.append(
            f"{clock} {statistics.median(quiet) * 1e3:6.2f} -> {statistics.median(flood) * 1e3:6.2f} ms "
            f"x{statistics.median(flood) / statistics.median(quiet):.3f} (paired x{paired:.3f})"
        )
    answers = report["flood"]
    total = sum(answers.values())
    shares = (
        ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(answers.items(), key=lambda kv: -kv[1])) if total else "-"
    )
    scrapes = [s for s in report["scrapes"] if s[0]]
    fresh = sum(1 for s in scrapes if s[1] == 200 and s[3] and s[2] < 1.0)
    worst = max((s[2] for s in scrapes), default=0.0)
    parts.append(
        f"flood {total / flood_s:7.0f} req/s ({shares}); 1 s scrape during flood: {fresh}/{len(scrapes)} "
        f"fresh, slowest {worst:.2f} s"
    )
    return " | ".join(parts)


if __name__ == "__main__":
    main()
