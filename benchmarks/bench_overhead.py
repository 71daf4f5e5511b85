"""Overhead of memexporter on a training step, and the latency of a modules scrape.

Runs a small GPT-style model on CPU (or a GPU: ``--device cuda``). Each variant (a setup/teardown pair around the same model
and optimizer) trains in blocks of ``--block`` steps; the variants alternate block by block for
``--rounds`` rounds, so drift in machine load hits all of them alike. Reports the median step
time of each variant and its ratio to ``plain``, and the step-rate ratio (mean step time of
``plain`` over the variant's: below 1 is slower; "paired": per round, then the median over
rounds, which a busy machine disturbs least). ``start+scrape`` is ``start`` while another process
(benchmarks/scraper.py, as Prometheus) scrapes /metrics once per second of the variant's own
time; its cost shows in the step-rate ratio, not the median (one step in many pays for it).
Then times ``ModulesCollector.collect()`` over a model with 100 tracked modules (p50/p99).

    python benchmarks/bench_overhead.py [--rounds 20] [--block 6] [--threads 1 --clock cpu]
    python benchmarks/bench_overhead.py --variants plain,start,start+scrape --rounds 30 --block 20
    python benchmarks/bench_overhead.py --device cuda [--batch 32 --seq 256]

On CUDA each timed step ends with ``torch.cuda.synchronize()`` (the benchmark's own measurement:
the exporter never synchronises), so the step time includes the GPU's work.

Add a variant by adding a ``(setup, teardown)`` pair to ``VARIANTS``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from torch import nn

import memexporter
from memexporter.collectors.modules import ModulesCollector
from memexporter.collectors.scrape import Identity, Scrape, Sources
from memexporter.config import Config
from memexporter.sweep.child import POLL_SECONDS
from memexporter.tracking.modules import track


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 4, heads: int = 4, ctx: int = 64) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def steps_per_block(step: Callable[[], None], seconds: float) -> int:
    """How many calls of ``step`` take about ``seconds`` (after 10 warm-up calls; at least 5)."""
    for _ in range(10):
        step()
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    return max(5, round(seconds / ((time.perf_counter() - t0) / 10)))


@dataclass
class Job:
    model: nn.Module
    opt: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    state: dict[str, Any] = field(default_factory=dict)

    def step(self) -> None:
        loss = F.cross_entropy(self.model(self.x).flatten(0, 1), self.y.flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.x.is_cuda:
            torch.cuda.synchronize(self.x.device)


def _nothing(job: Job) -> None:
    return None


def _track(job: Job) -> None:
    job.state["handle"] = track(job.model, job.opt)


def _untrack(job: Job) -> None:
    job.state.pop("handle").remove()


def _start(job: Job) -> None:
    # The exporter as a user runs it: server thread up, global optimizer step hooks installed.
    job.state["exporter"] = memexporter.start(port=0, addr="127.0.0.1")


def _stop(job: Job) -> None:
    job.state.pop("exporter").stop()


def _start_track(job: Job) -> None:
    _start(job)
    _track(job)


def _untrack_stop(job: Job) -> None:
    _untrack(job)
    _stop(job)


# What a `memexporter sweep` child sees: its /metrics read every POLL_SECONDS, by another process.
_POLLER = (
    "import sys, time, urllib.request\nwhile True:\n    urllib.request.urlopen(sys.argv[1]).read()\n"
    "    time.sleep(float(sys.argv[2]))\n"
)
_poll_seconds = POLL_SECONDS  # --poll-seconds


def _start_track_poll(job: Job) -> None:
    _start_track(job)
    job.state["poller"] = subprocess.Popen(
        [sys.executable, "-c", _POLLER, job.state["exporter"].url, str(_poll_seconds)], stderr=subprocess.DEVNULL
    )
    time.sleep(0.5)  # the poller's interpreter is up and scraping before the block is timed


def _stop_poll_untrack(job: Job) -> None:
    poller = job.state.pop("poller")
    poller.kill()
    poller.wait()
    _untrack_stop(job)


class Scraper:
    """One paced scraper process for the whole run (benchmarks/scraper.py paced), pointed at the
    exporter while a variant's block runs and paused in between."""

    _proc: subprocess.Popen[str] | None = None

    @classmethod
    def command(cls, line: str) -> None:
        if cls._proc is None:
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scraper.py")
            cls._proc = subprocess.Popen(
                [sys.executable, script, "paced", "--interval", "1.0"],
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        assert cls._proc.stdin is not None and cls._proc.stdout is not None
        cls._proc.stdin.write(line + "\n")
        cls._proc.stdin.flush()
        assert cls._proc.stdout.readline().strip() == "ack"

    @classmethod
    def close(cls) -> str:
        if cls._proc is None:
            return ""
        out, _ = cls._proc.communicate("", timeout=60)
        cls._proc = None
        return out.strip().splitlines()[-1]


def _start_scrape(job: Job) -> None:
    _start(job)
    Scraper.command(job.state["exporter"].url)


def _stop_scrape(job: Job) -> None:
    Scraper.command("-")
    _stop(job)


Variant = tuple[Callable[[Job], None], Callable[[Job], None]]
VARIANTS: dict[str, Variant] = {
    "plain": (_nothing, _nothing),
    "start": (_start, _stop),  # step hooks only: issue 3's "the step hook adds no measurable time"
    "tracked": (_track, _untrack),  # module hooks only
    "start+track": (_start_track, _untrack_stop),  # what `start(model=...)` costs
    "sweep-poll": (_start_track_poll, _stop_poll_untrack),  # start+track, scraped as often as a sweep does
    "start+scrape": (_start_scrape, _stop_scrape),  # start() with Prometheus scraping once a second
}


def bench_steps(
    rounds: int,
    block: int,
    batch: int,
    seq: int,
    clock: Callable[[], float] = time.perf_counter,
    device: str = "cpu",
    variants: list[str] | None = None,
) -> dict[str, list[float]]:
    torch.manual_seed(0)
    model = GPT(ctx=seq).to(device)
    job = Job(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-3),
        torch.randint(0, 512, (batch, seq), device=device),
        torch.randint(0, 512, (batch, seq), device=device),
    )
    for _ in range(5):  # warm-up: allocator, optimizer state, oneDNN kernels
        job.step()
    return interleaved(job, {name: VARIANTS[name] for name in variants or VARIANTS}, rounds, block, clock)


def interleaved(
    job: Job, variants: dict[str, Variant], rounds: int, block: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[float]]:
    """Seconds per step of each variant: ``rounds`` rounds of ``block`` timed steps each, the
    variants interleaved in one process so that drift on the machine hits them all alike."""
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        # Alternate the order too, so neither variant always runs right after the other.
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            setup, teardown = variants[name]
            setup(job)
            job.step()  # the first step after setup is not timed (e.g. hooks being installed)
            for _ in range(block):
                t0 = clock()
                job.step()
                times[name].append(clock() - t0)
            teardown(job)
    return times


def bench_scrape(modules: int, repeat: int) -> list[float]:
    """Seconds per ``ModulesCollector.collect()`` with ``modules`` tracked module rows."""
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(modules)))
    opt = torch.optim.AdamW(model.parameters())
    handle = track(model, opt, max_modules=modules)
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    cfg = Config.resolve({}, environ={})
    sources = Sources(Identity("0", "0", "1", "bench"), cfg, None, None, None)  # type: ignore[arg-type]
    collector = ModulesCollector()

    def scrape() -> None:
        for fam in collector.collect(Scrape(sources)):
            assert fam.samples

    try:
        return timeit.repeat(scrape, number=1, repeat=repeat)
    finally:
        handle.remove()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=6, help="steps per variant per round")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the training thread's CPU time (with --threads 1: immune to a busy machine); "
        "wall for start+scrape, whose cost is the server thread's, not the training thread's",
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model trains (default cpu)")
    ap.add_argument(
        "--poll-seconds",
        type=float,
        default=POLL_SECONDS,
        help=f"the sweep-poll variant's interval (default {POLL_SECONDS}, as memexporter sweep)",
    )
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    args = ap.parse_args()
    global _poll_seconds
    _poll_seconds = args.poll_seconds
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    if args.device == "cuda" and args.clock == "cpu":
        ap.error("--clock cpu measures the host thread only; use the wall clock with --device cuda")
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    if "plain" not in variants:
        ap.error("--variants must include plain (the ratios are to it)")
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(
        f"torch {torch.__version__}, {where}, {args.clock} clock, "
        f"{args.rounds} rounds x {args.block} steps per variant, batch {args.batch} x seq {args.seq}"
    )
    times = bench_steps(args.rounds, args.block, args.batch, args.seq, clock, args.device, variants)
    base = statistics.median(times["plain"])
    base_mean = statistics.fmean(times["plain"])
    for name, ts in times.items():
        med = statistics.median(ts)
        # Paired: the ratio of block medians within each round, then the median over rounds.
        # Robust to load that drifts between rounds (a shared CI box).
        blocks = [
            statistics.median(ts[i : i + args.block]) / statistics.median(times["plain"][i : i + args.block])
            for i in range(0, len(ts), args.block)
        ]
        # The step rate of a block (its mean step, so the one step that paid for a scrape counts)
        # against the plain block of the same round; the median over rounds.
        rates = [
            statistics.fmean(times["plain"][i : i + args.block]) / statistics.fmean(ts[i : i + args.block])
            for i in range(0, len(ts), args.block)
        ]
        print(
            f"  {name:12s} median step {med * 1e3:8.2f} ms  p90 {pct(ts, 0.9) * 1e3:8.2f} ms  "
            f"ratio {med / base:.4f}  paired ratio {statistics.median(blocks):.4f}  "
            f"step rate x{base_mean / statistics.fmean(ts):.4f}  paired step rate x{statistics.median(rates):.4f}"
        )
    if "start+scrape" in variants:
        print(f"  scrapes during start+scrape blocks: {Scraper.close()}")
    scrape = bench_scrape(100, args.scrapes)
    print(
        f"  modules scrape, 100 modules: p50 {pct(scrape, 0.5) * 1e6:.0f} us  "
        f"p99 {pct(scrape, 0.99) * 1e6:.0f} us  ({len(scrape)} scrapes)"
    )


if __name__ == "__main__":
    main()
