"""Cost and boundedness of the trend math over 10**6 SYNTHETIC steps.

Feeds a leaking per-step trace (8 MiB/step, 0.5 s/step, with noise) through ``TrendWindow.add``
and, every 1000 steps as a scrape would, ``snapshot()`` + ``estimate()``. Reports the median time
per add over the first and last 100k steps (must be flat), per snapshot and per estimate,
and the process RSS at start, midway and end (must be flat once the window is full). Runs for the
default window (200) and the largest allowed (100 000).

    python benchmarks/bench_trend.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from statistics import median

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import psutil

from memexporter.oom.trend import TrendWindow, estimate

MIB = float(1 << 20)
SCRAPE_EVERY = 1000


def run(capacity: int, steps: int) -> dict[str, float]:
    proc = psutil.Process()
    # Precomputed noise, reused cyclically, so the timed loop does no generation work.
    noise = np.random.default_rng(0).normal(0.0, 2 * MIB, 4096).tolist()
    window = TrendWindow(capacity, warmup_steps=20)
    block = steps // 10  # first and last tenth: 100k steps each for 10**6
    # Per-block times, summarised by their median: a shared CI machine preempts the process now
    # and then, and a median of 100 blocks shrugs that off where a total would not.
    add_first: list[float] = []
    add_last: list[float] = []
    snap_s: list[float] = []
    est_s: list[float] = []
    rss_start = proc.memory_info().rss
    rss_mid = 0
    add = window.add
    for start in range(0, steps, SCRAPE_EVERY):
        t0 = time.perf_counter()
        for s in range(start, start + SCRAPE_EVERY):
            b = 4e9 + 8 * MIB * s + noise[s & 4095]
            add(s, 0.5 * s, b, b + 512 * MIB)
        dt = time.perf_counter() - t0
        if start < block:
            add_first.append(dt / SCRAPE_EVERY)
        elif start >= steps - block:
            add_last.append(dt / SCRAPE_EVERY)
        t0 = time.perf_counter()
        points = window.snapshot()
        t1 = time.perf_counter()
        est = estimate(points, 1e15)
        est_s.append(time.perf_counter() - t1)
        snap_s.append(t1 - t0)
        if start + SCRAPE_EVERY == steps // 2:
            rss_mid = proc.memory_info().rss
    rss_end = proc.memory_info().rss
    # A wrong answer would make the timings meaningless: check the estimate saw the 8 MiB/step.
    assert abs(est.leak_bytes_per_step / (8 * MIB) - 1) < 0.01, est
    assert len(window) == capacity
    return {
        "add_first_us": median(add_first) * 1e6,
        "add_last_us": median(add_last) * 1e6,
        "snapshot_us": median(snap_s) * 1e6,
        "estimate_ms": median(est_s) * 1e3,
        "estimate_p99_ms": sorted(est_s)[int(0.99 * (len(est_s) - 1))] * 1e3,
        "rss_start_mib": rss_start / MIB,
        "rss_mid_mib": rss_mid / MIB,
        "rss_end_mib": rss_end / MIB,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10**6, help="simulated steps per window size (multiple of 10000)")
    args = p.parse_args()
    print(
        f"bench_trend: {args.steps} synthetic steps, estimate every {SCRAPE_EVERY} steps, "
        f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} CPUs"
    )
    header = (
        "capacity",
        "add first us",
        "add last us",
        "last/first",
        "snapshot us",
        "estimate ms",
        "est p99 ms",
        "RSS start MiB",
        "RSS mid MiB",
        "RSS end MiB",
        "end/mid",
    )
    print(" | ".join(header))
    for capacity in (200, 100_000):
        r = run(capacity, args.steps)
        print(
            " | ".join(
                [
                    f"{capacity:>8}",
                    f"{r['add_first_us']:12.3f}",
                    f"{r['add_last_us']:11.3f}",
                    f"{r['add_last_us'] / r['add_first_us']:10.2f}",
                    f"{r['snapshot_us']:11.1f}",
                    f"{r['estimate_ms']:11.3f}",
                    f"{r['estimate_p99_ms']:10.3f}",
                    f"{r['rss_start_mib']:13.1f}",
                    f"{r['rss_mid_mib']:11.1f}",
                    f"{r['rss_end_mib']:11.1f}",
                    f"{r['rss_end_mib'] / r['rss_mid_mib']:7.3f}",
                ]
            )
        )
    print("Medians over 1000-step blocks (100 blocks per 100k steps) and over scrapes. The add time includes")
    print("the loop's own work (building one point), so it is an upper bound on add().")


if __name__ == "__main__":
    main()
