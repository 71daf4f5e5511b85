"""The soak's figures (``bench_soak.py``), from its samples: growth after warm-up, the ends against the starts,
restarts against kills, the step time against the quiet run. Pure: the samples in, one dict out (``text``: as
lines for a person)."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

MIB = 1 << 20


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ends(rows: list[dict[str, int]], key: str, n: int = 3) -> tuple[float | None, float | None]:
    """The median of the first ``n`` and of the last ``n`` values of ``key``: a start and an end that one
    transient reading (a connection open at that instant) does not move."""
    values = [float(r[key]) for r in rows]
    return _median(values[:n]), _median(values[-n:])


def _lives(samples: list[dict[str, Any]]) -> list[list[dict[str, int]]]:
    """The helper's samples, one list per process (a restart is a new one), in order; each life's first
    sample left out (its interpreter still warming up)."""
    lives: list[list[dict[str, int]]] = []
    pid = None
    for s in samples:
        helper = s["helper"]
        if helper is None:
            continue
        if helper["pid"] != pid:
            pid = helper["pid"]
            lives.append([])
            continue
        lives[-1].append(helper)
    return [life for life in lives if life]


def summarise(
    args: argparse.Namespace,
    samples: list[dict[str, Any]],
    windows: dict[str, list[float]],
    kills: list[dict[str, Any]],
    forks: int,
    restarts: float | None,
    counts: dict[str, Any],
    zombies_at_end: list[int],
) -> dict[str, Any]:
    after = [s for s in samples if s["at"] >= args.warmup and s["job"] is not None]
    job = [s["job"] for s in after]
    rss0, rss1 = _ends(job, "rss")
    fds0, fds1 = _ends(job, "fds")
    threads0, threads1 = _ends(job, "threads")
    lives = _lives(after)
    growth = [(life[-1]["rss"] - life[0]["rss"]) / MIB for life in lives if len(life) >= 2]
    quiet, soak = windows["quiet"], windows["soak"]
    q = _median(quiet)
    latencies = [k["answering_after_s"] for k in kills if k.get("answering_after_s") is not None]
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "job": {
            "rss_mib": [rss0 and rss0 / MIB, rss1 and rss1 / MIB],
            "rss_growth_mib": (rss1 - rss0) / MIB if rss0 and rss1 else None,
            "fds": [fds0, fds1],
            "threads": [threads0, threads1],
        },
        "helper": {
            "lives_sampled": len(lives),
            "rss_growth_within_a_life_mib_max": max(growth) if growth else None,
            "rss_first_life_last_life_mib": [lives[0][0]["rss"] / MIB, lives[-1][0]["rss"] / MIB] if lives else None,
            "fds_first_life_last_life": [lives[0][-1]["fds"], lives[-1][-1]["fds"]] if lives else None,
            "threads_first_life_last_life": [lives[0][-1]["threads"], lives[-1][-1]["threads"]] if lives else None,
        },
        "zombies": {"max_seen": max((s["zombies"] for s in after), default=0), "at_end": len(zombies_at_end)},
        "kills": len(kills),
        "restarts_total": restarts,
        "answering_again_s": latencies,
        "forks": forks,
        "load": counts,
        "samples": samples,  # every look, warm-up included: what a figure above hides
        "steps": {
            "quiet_windows": len(quiet),
            "soak_windows": len(soak),
            "quiet_median_ms": q and q * 1e3,
            "soak_median_ms": (_median(soak) or 0) * 1e3,
            "ratio": (_median(soak) or 0) / q if q else None,
            "quiet_spread": [min(quiet) / q, max(quiet) / q] if q else None,
        },
    }


def text(r: dict[str, Any]) -> str:
    def f(v: float | None, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    job, helper, steps = r["job"], r["helper"], r["steps"]
    spread = steps["quiet_spread"] or [None, None]
    lines = [
        f"soak of {r['settings']['duration']:g} s after {r['settings']['warmup']:g} s of warm-up",
        f"  job RSS {f(job['rss_mib'][0], '.1f')} -> {f(job['rss_mib'][1], '.1f')} MiB: "
        f"growth {f(job['rss_growth_mib'])} MiB",
        f"  job descriptors {f(job['fds'][0], 'g')} -> {f(job['fds'][1], 'g')}, "
        f"threads {f(job['threads'][0], 'g')} -> {f(job['threads'][1], 'g')}",
        f"  helper: {helper['lives_sampled']} lives sampled; RSS growth within a life at most "
        f"{f(helper['rss_growth_within_a_life_mib_max'])} MiB; first/last life RSS {helper['rss_first_life_last_life_mib']}"
        f" MiB, descriptors {helper['fds_first_life_last_life']}, threads {helper['threads_first_life_last_life']}",
        f"  zombies: at most {r['zombies']['max_seen']} seen, {r['zombies']['at_end']} at the end",
        f"  kills {r['kills']}, memexporter_helper_restarts_total {r['restarts_total']}, answering again after "
        + ", ".join(f"{x:.2f}" for x in r["answering_again_s"])
        + " s",
        f"  forked children {r['forks']}; load {r['load']}",
        f"  step: quiet {f(steps['quiet_median_ms'], '.3f')} ms, soak {f(steps['soak_median_ms'], '.3f')} ms, "
        f"ratio x{f(steps['ratio'], '.3f')} (quiet windows spread x{f(spread[0], '.3f')}..x{f(spread[1], '.3f')}; "
        f"{steps['quiet_windows']} and {steps['soak_windows']} windows of 10 s)",
    ]
    return "\n".join(lines)
