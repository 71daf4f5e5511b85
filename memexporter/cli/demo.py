"""``memexporter demo``: a small GPT-style training loop with the exporter on.

It trains on random tokens (nothing to download), on CPU or GPU, and can leak on request
(``--leak-mib-per-step``), stop with a simulated OOM at a budget (``--memory-limit-mib``), hold
extra memory on one rank (``--rank-extra-mib``), run evaluation forwards (``--eval-every``) and train
on variable lengths (``--seq-len-min``: each step's length drawn between it and ``--seq-len``, declared
with ``--max-input-elements``), so every metric, alert and dashboard has something real to show.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

import torch
from torch import nn

import memexporter
from memexporter import exporter
from memexporter.cli.argtypes import integer, number, rank_mib
from memexporter.collectors.scrape import Scrape
from memexporter.exporter import Exporter
from memexporter.oom.trend import estimate
from memexporter.units import MiB
from memexporter.units import fmt_bytes as _fmt_bytes
from memexporter.units import fmt_eta as _fmt_eta

SIMULATED_OOM_EXIT = 3
HEADS = 4


class TinyGPT(nn.Module):
    """Embedding, a few pre-norm transformer blocks and a head tied to the embedding."""

    def __init__(self, vocab: int = 512, d_model: int = 128, layers: int = 4, heads: int = HEADS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as in GPT-2: counted once
        # GPT-2's init: with nn.Embedding's N(0, 1) the tied head starts with logits ~10x too big.
        nn.init.normal_(self.embed.weight, std=0.02)
        # --leak-mib-per-step keeps its tensors here, so /debug/memory names a real holder.
        self.leak_store: list[torch.Tensor] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def _status(exp: Exporter, device: str) -> tuple[float, float, str]:
    """``(used, limit, progress text)`` for the training device, read from the exporter's own state."""
    view = Scrape(exp.sources).views[device]
    snap = exp.sources.steps.snapshot() if exp.sources.steps is not None else None
    points = snap.devices.get(device) if snap is not None else None
    limit = view.limit if view.limit is not None else math.inf  # unknown: nothing to count down to
    est = estimate(points, view.limit) if points is not None else None
    leak = f"{_fmt_bytes(est.leak_bytes_per_step)}/step" if est is not None else "-"
    eta = _fmt_eta(est.oom_eta_seconds) if est is not None else "none"
    text = f"{device} used {_fmt_bytes(view.used)} / limit {_fmt_bytes(limit)} | leak {leak} | OOM ETA {eta}"
    return view.used, limit, text


def _extra_bytes(spec: tuple[int, int] | None, rank: int) -> int:
    # (R, N) from "R:N" makes rank R hold N extra MiB, for the rank-imbalance alert.
    return spec[1] * MiB if spec is not None and spec[0] == rank else 0


def run(args: argparse.Namespace) -> int:
    """Train until ``--steps`` (0: until interrupted), printing a progress line every second."""
    if args.d_model % HEADS:
        print(
            f"memexporter demo: --d-model must be a multiple of {HEADS} (the attention heads), got {args.d_model}",
            file=sys.stderr,
        )
        return 2
    if args.seq_len_min > args.seq_len:
        print(
            f"memexporter demo: --seq-len-min ({args.seq_len_min}) must be at most --seq-len ({args.seq_len})",
            file=sys.stderr,
        )
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("memexporter demo: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1:
        torch.distributed.init_process_group("nccl" if device == "cuda" else "gloo")
    gpt = TinyGPT(layers=args.layers, d_model=args.d_model).to(device)
    model: nn.Module = gpt
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    limit = args.memory_limit_mib * MiB if args.memory_limit_mib else None
    exp = exporter.start(
        port=args.port,
        addr=args.addr,
        memory_limit_bytes=limit,
        warmup_steps=args.warmup_steps,
        max_input_elements=args.max_input_elements,
        port_hint="--port or MEMEXPORTER_PORT",
    )
    if not args.no_track:
        exp.tracked.append(memexporter.track(model, opt))
    mem_device = f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"
    where = (
        f"open {exp.url.removesuffix('/metrics')}/ in a browser (metrics at {exp.url})"
        if exp.url
        else "metrics " + ("(push only: http=False)" if not exp.config.http else "(not serving: see the error above)")
    )
    print(
        f"memexporter demo: training a {sum(p.numel() for p in model.parameters()):,}-parameter GPT on {mem_device}; "
        f"{where}",
        flush=True,
    )
    kept: list[torch.Tensor] = []
    if extra := _extra_bytes(args.rank_extra_mib, rank):
        kept.append(torch.ones(extra // 4, dtype=torch.float32, device=device))
    loss_fn = nn.CrossEntropyLoss()
    step, last_print = 0, 0.0
    lengths = random.Random(0)  # variable lengths: the same sequence of them in every run
    try:
        while args.steps == 0 or step < args.steps:
            started = time.monotonic()
            length = lengths.randint(args.seq_len_min, args.seq_len) if args.seq_len_min else args.seq_len
            tokens = torch.randint(0, 512, (args.batch_size, length + 1), device=device)
            loss = loss_fn(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if args.leak_mib_per_step:
                # ones(), not empty(): on the CPU untouched pages never become resident.
                gpt.leak_store.append(
                    torch.ones(int(args.leak_mib_per_step * MiB) // 4, dtype=torch.float32, device=device)
                )
            if args.eval_every and step % args.eval_every == 0:
                with memexporter.phase("eval"), torch.no_grad():
                    model(torch.randint(0, 512, (args.batch_size * 4, args.seq_len), device=device))
            used, lim, text = _status(exp, mem_device)
            if limit is not None and used >= lim:
                print(
                    f"memexporter demo: simulated OOM at step {step}: {text}. Stopping before the machine is hurt.",
                    file=sys.stderr,
                    flush=True,
                )
                return SIMULATED_OOM_EXIT
            if time.monotonic() - last_print >= 1.0:
                last_print = time.monotonic()
                print(f"step {step:6d} | loss {loss.item():.3f} | {text}", flush=True)
            if (pause := args.step_interval - (time.monotonic() - started)) > 0:
                time.sleep(pause)
            if args.stall_after_steps and step >= args.stall_after_steps:
                print(
                    f"memexporter demo: stalling after step {step}, as asked: the process stays up, no more steps",
                    file=sys.stderr,
                    flush=True,
                )
                while True:  # a hung collective, as the stalled-run alert sees it
                    time.sleep(1.0)
    except KeyboardInterrupt:
        print("memexporter demo: interrupted", file=sys.stderr)
    finally:
        exp.stop()
        if world > 1:
            torch.distributed.destroy_process_group()
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``memexporter demo``'s options, on ``p``."""
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where to train (default: auto)")
    p.add_argument(
        "--port",
        type=integer(0, 65535),
        default=None,
        help="base port, 0-65535 (default: MEMEXPORTER_PORT or 9400; rank r adds LOCAL_RANK)",
    )
    p.add_argument("--addr", default=None, help="bind address, an IP (default: MEMEXPORTER_ADDR or all interfaces)")
    p.add_argument("--steps", type=integer(0), default=0, help="steps to train; 0 trains until interrupted (default)")
    p.add_argument("--step-interval", type=number(0), default=0.0, metavar="S", help="minimum seconds per step")
    p.add_argument(
        "--leak-mib-per-step", type=number(0), default=0.0, metavar="N", help="keep N MiB alive per step (a leak)"
    )
    p.add_argument(
        "--memory-limit-mib",
        type=integer(1),
        default=None,
        metavar="M",
        help="exporter budget; stop with a simulated OOM when used reaches it",
    )
    p.add_argument(
        "--rank-extra-mib", type=rank_mib, default=None, metavar="R:N", help="rank R holds N extra MiB (rank imbalance)"
    )
    p.add_argument(
        "--eval-every", type=integer(0), default=0, metavar="K", help="an evaluation forward every K steps (0: none)"
    )
    p.add_argument("--warmup-steps", type=integer(0), default=None, help="steps the leak estimate ignores at start")
    p.add_argument(
        "--stall-after-steps",
        type=integer(0),
        default=0,
        metavar="N",
        help="stop stepping after N steps while the process stays up (a hung job; 0: never)",
    )
    # The sizes a `memexporter sweep` varies: memory grows with each.
    p.add_argument("--batch-size", "--batch", type=integer(1), default=8, help="sequences per step (default 8)")
    p.add_argument("--seq-len", type=integer(1), default=64, help="tokens per sequence (default 64)")
    p.add_argument(
        "--seq-len-min",
        type=integer(1),
        default=0,
        metavar="N",
        help="train on variable lengths: each step's length drawn uniformly from N to --seq-len (0: fixed)",
    )
    p.add_argument(
        "--max-input-elements",
        type=integer(1),
        default=None,
        metavar="N",
        help="declare the largest step input the data can bring, in elements (max_input_elements)",
    )
    p.add_argument("--layers", type=integer(1), default=4, help="transformer blocks (default 4)")
    p.add_argument(
        "--d-model",
        type=integer(HEADS),
        default=128,
        help=f"model width, a multiple of the {HEADS} heads (default 128)",
    )
    p.add_argument("--no-track", action="store_true", help="do not track per-module memory")


def main(argv: list[str]) -> int:
    """``memexporter demo [options]``: its own parser (building it imports torch, which no other
    subcommand should wait for)."""
    from memexporter.cli import COMMANDS

    what = COMMANDS["demo"].help
    parser = argparse.ArgumentParser(prog="memexporter demo", description=what[0].upper() + what[1:] + ".")
    add_arguments(parser)
    return run(parser.parse_args(argv))
