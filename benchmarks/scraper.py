"""Scrapers in their own process, as Prometheus is: the exporter's process pays only for serving.

    python benchmarks/scraper.py concurrent URL --scrapers 20 --seconds 10
        20 threads GET URL back to back for 10 s; prints one JSON line of latencies (seconds),
        error count and scrapes per second.
    python benchmarks/scraper.py paced --interval 1.0
        reads commands on stdin: a URL starts scraping it, "-" pauses, EOF ends. Scrapes once per
        ``interval`` seconds of *scraping time* (the clock runs only while not paused), so short
        benchmark blocks that alternate with others still see exactly one scrape a second.
        Prints "ok N" / "err N" counts at the end.

Used by bench_scrape.py (--concurrency) and bench_overhead.py (the start+scrape variant).
``Client`` drives a benchmark's own ``--client`` process (bench_flood.py, bench_launch.py) a line at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request


class Client:
    """``script --client PORT`` in a process of its own, told what to do one line at a time on its
    stdin and answering on its stdout: the clients of bench_flood.py and bench_launch.py."""

    def __init__(self, script: str, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(script), "--client", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout

    def tell(self, cmd: str) -> None:
        self._stdin.write(cmd + "\n")
        self._stdin.flush()

    def answer(self) -> str:
        return self._stdout.readline()

    def close(self) -> None:
        self._stdin.close()
        self.proc.kill()


def _get(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:
        r.read()
    return time.perf_counter() - t0


def concurrent(url: str, scrapers: int, seconds: float) -> dict[str, object]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < end:
            try:
                took = _get(url)
            except OSError:
                with lock:
                    errors[0] += 1
                continue
            with lock:
                latencies.append(took)

    threads = [threading.Thread(target=loop) for _ in range(scrapers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"latencies": latencies, "errors": errors[0], "rate": len(latencies) / (time.monotonic() - t0)}


def paced(interval: float) -> None:
    state: dict[str, object] = {"url": None}
    counts = {"ok": 0, "err": 0}
    done = threading.Event()

    def scrape_loop() -> None:
        owed, last = 0.0, time.monotonic()
        while not done.is_set():
            time.sleep(0.005)
            now = time.monotonic()
            url = state["url"]
            if url is None:
                last = now
                continue
            owed += now - last
            last = now
            if owed >= interval:
                owed -= interval
                try:
                    _get(str(url))
                    counts["ok"] += 1
                except OSError:
                    counts["err"] += 1

    worker = threading.Thread(target=scrape_loop)
    worker.start()
    for line in sys.stdin:
        command = line.strip()
        state["url"] = None if command == "-" else command
        print("ack", flush=True)  # the benchmark waits for this before timing the block
    done.set()
    worker.join()
    print(f"ok {counts['ok']} err {counts['err']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("concurrent")
    c.add_argument("url")
    c.add_argument("--scrapers", type=int, default=20)
    c.add_argument("--seconds", type=float, default=10.0)
    p = sub.add_parser("paced")
    p.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    if args.mode == "concurrent":
        print(json.dumps(concurrent(args.url, args.scrapers, args.seconds)))
    else:
        paced(args.interval)


if __name__ == "__main__":
    main()
