"""argparse ``type=`` checkers for the command line: a bad value is a one-line usage error
(``argument --steps: must be an integer >= 0, got '-5'``), never a traceback or a silent no-op."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def integer(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An integer in ``[lo, hi]`` (no upper bound when ``hi`` is None)."""
    bound = f"{lo}-{hi}" if hi is not None else f">= {lo}"

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {text!r}") from None
        if n < lo or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {text!r}")
        return n

    parse.__name__ = f"integer {bound}"  # argparse names the type in some messages
    return parse


def number(lo: float = 0.0) -> Callable[[str], float]:
    """A finite number ``>= lo``."""

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number >= {lo:g}, got {text!r}") from None
        if not math.isfinite(x) or x < lo:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {lo:g}, got {text!r}")
        return x

    parse.__name__ = f"number >= {lo:g}"
    return parse


def rank_mib(text: str) -> tuple[int, int]:
    """``RANK:MIB``, e.g. ``1:512``: rank 1 holds 512 MiB more."""
    try:
        rank, mib = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like RANK:MIB (e.g. 1:512), got {text!r}") from None
    if rank < 0 or mib < 0:
        raise argparse.ArgumentTypeError(f"RANK and MIB must be >= 0, got {text!r}")
    return rank, mib
