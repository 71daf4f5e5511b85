"""The grid of a sweep: axes from ``--grid NAME=V1,V2,...``, the command's placeholders, the run order.

An axis is numeric when all its values are numbers (``4``, ``0.5``, ``1e3``) and categorical when
none is (``adamw,sgd``); a mix is an error that names the odd value. Numeric axes run from small
to large whatever order they were given in; categorical ones keep the given order. Memory is
assumed never to shrink as a numeric axis grows, which is what lets a sweep skip the sizes above
one that ran out of memory (``dominates``).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# ``{name}``, but not ``${name}``: a shell variable in ``sh -c '...'`` is not a placeholder.
PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Params = Mapping[str, str]
"""One configuration: axis name to the value as written on the command line."""


class SweepError(ValueError):
    """Bad input, or a command that cannot be measured. The message starts with ``memexporter sweep:``."""

    def __init__(self, message: str) -> None:
        super().__init__(f"memexporter sweep: {message}")


def number(text: str) -> float | None:
    """``text`` as a finite number, or ``None``."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Axis:
    """One ``--grid`` axis. ``values`` are the literal strings, in run order."""

    name: str
    values: tuple[str, ...]
    numeric: bool

    def key(self, value: str) -> float:
        """Where ``value`` sits on the axis: the number itself, or its position for a categorical axis."""
        n = number(value) if self.numeric else None
        return n if n is not None else float(self.values.index(value))

    def typed(self, value: str) -> int | float | str:
        """The value as JSON should hold it: an int, a float, or the word."""
        if not self.numeric:
            return value
        try:
            return int(value)
        except ValueError:
            return float(value)

    @property
    def integer(self) -> bool:
        return self.numeric and all(isinstance(self.typed(v), int) for v in self.values)


def parse_axis(spec: str) -> Axis:
    """``"batch=16,4,8"`` -> ``Axis("batch", ("4", "8", "16"), numeric=True)``; ``SweepError`` names what is wrong."""
    name, sep, rest = spec.partition("=")
    name = name.strip()
    if not sep:
        raise SweepError(f"--grid {spec!r}: expected NAME=V1,V2,... (e.g. --grid batch=4,8,16)")
    if not _NAME.match(name):
        raise SweepError(
            f"--grid {spec!r}: the axis name {name!r} must be a Python identifier, as in the {{name}} placeholder"
        )
    if not rest.strip():
        raise SweepError(f"--grid {spec!r}: axis {name!r} has no values (the grid is empty)")
    values = [v.strip() for v in rest.split(",")]
    if "" in values:
        raise SweepError(f"--grid {spec!r}: axis {name!r} has an empty value (two commas, or one at the end)")
    numbers = [number(v) for v in values]
    words = [v for v, n in zip(values, numbers, strict=True) if n is None]
    if words and len(words) < len(values):
        raise SweepError(
            f"--grid {spec!r}: {', '.join(map(repr, words))} in axis {name!r} is not a number, but the "
            "axis's other values are; an axis is all numbers or all words"
        )
    numeric = not words
    keys = numbers if numeric else values
    if len(set(keys)) < len(keys):
        dup = next(v for i, v in enumerate(values) if keys[i] in keys[:i])
        raise SweepError(f"--grid {spec!r}: axis {name!r} has the value {dup!r} twice")
    if numeric:
        values.sort(key=float)
    return Axis(name, tuple(values), numeric)


def parse_grid(specs: Sequence[str] | None) -> list[Axis]:
    """All ``--grid`` options, in the order given (the first axis is the one plotted and fitted)."""
    if not specs:
        raise SweepError("no --grid given: name at least one axis, e.g. --grid batch=4,8,16")
    axes = [parse_axis(s) for s in specs]
    names = [a.name for a in axes]
    if dup := next((n for i, n in enumerate(names) if n in names[:i]), None):
        raise SweepError(f"--grid: axis {dup!r} is given twice; list all its values in one --grid {dup}=...")
    return axes


def check_command(command: Sequence[str], axes: Sequence[Axis]) -> None:
    """Every ``{name}`` in the command is an axis, and every axis appears in the command."""
    if not command:
        raise SweepError(
            "no command: put it after --, e.g. memexporter sweep --grid batch=4,8 -- python train.py --batch {batch}"
        )
    used = {m.group(1) for arg in command for m in PLACEHOLDER.finditer(arg)}
    names = [a.name for a in axes]
    if unknown := sorted(used - set(names)):
        raise SweepError(
            f"unknown placeholder {', '.join('{' + u + '}' for u in unknown)} in the command; "
            f"the grid defines {', '.join('{' + n + '}' for n in names)}"
        )
    if unused := [n for n in names if n not in used]:
        raise SweepError(
            f"axis {unused[0]!r} is not used in the command (no {{{unused[0]}}} placeholder): "
            "every value would run the same command"
        )


def substitute(command: Sequence[str], params: Params) -> list[str]:
    """The command of one run: each ``{name}`` replaced by that axis's value."""
    return [PLACEHOLDER.sub(lambda m: params[m.group(1)], arg) for arg in command]


def plan(axes: Sequence[Axis]) -> list[dict[str, str]]:
    """Every combination, small to large along each axis (the first axis varies slowest)."""
    return [
        dict(zip([a.name for a in axes], combo, strict=True)) for combo in itertools.product(*(a.values for a in axes))
    ]


def dominates(axes: Iterable[Axis], smaller: Params, params: Params) -> bool:
    """``params`` is at least ``smaller`` on every numeric axis and equal on every categorical one,
    so it needs at least as much memory."""
    return all(
        a.key(params[a.name]) >= a.key(smaller[a.name]) if a.numeric else params[a.name] == smaller[a.name]
        for a in axes
    )


def label(params: Params) -> str:
    """``batch=8 seq=128``, for messages and the progress line."""
    return " ".join(f"{k}={v}" for k, v in params.items())
