"""The diagnosis in words: the one-line log messages and the tensor-group formatting of
``memexporter inspect`` (bytes and times: ``memexporter.units``). No torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from memexporter.units import fmt_bytes

if TYPE_CHECKING:
    from memexporter.diagnose.findings import Named, NamedGraph

NO_HOLDER = "nothing that Python can see (a C++ owner: an autograd graph, a hook, a CUDA graph pool?)"


def fmt_group(dtype: str, shape: Sequence[int]) -> str:
    """``float32[1, 2097152]``; a dimension of -1 varies between the tensors."""
    return f"{dtype}[{', '.join(str(d) for d in shape)}]"


def fmt_rate(x: float) -> str:
    """``+1``, ``+0.5``: a count per step, with its sign."""
    return f"{x:+.3g}"


def leak_line(device: str, rate: float, top: Named) -> str:
    """The warning for a leak of ``rate`` bytes per step that the tensor group ``top`` explains: its dtype,
    shape and device, its count per step, and its first holder."""
    g = top.growth
    holder = top.held_by[0] if top.held_by else NO_HOLDER
    kind = "" if g.key[3] == "other" else f" ({g.key[3].replace('_', ' ')})"
    return (
        f"memexporter: leaking {fmt_bytes(rate)}/step: {fmt_group(g.key[1], g.key[2])} on {g.key[0]}{kind}, "
        f"{fmt_rate(g.count_per_step)} per step, held by {holder}. Details: memexporter inspect"
    )


def unexplained_line(device: str, rate: float) -> str:
    """The warning for a leak of ``rate`` bytes per step on ``device`` that no tensor group's growth explains."""
    return (
        f"memexporter: leaking {fmt_bytes(rate)}/step on {device}, but no tensor group grows: the memory is "
        "outside tensors (Python objects, a C extension, allocator caching). Details: memexporter inspect"
    )


def graph_line(top: NamedGraph, count: int) -> str:
    """The warning for ``count`` tensors whose autograd graphs survive from step to step: ``top``'s group and
    its first holder."""
    g = top.graph
    holder = top.held_by[0] if top.held_by else NO_HOLDER
    return (
        f"memexporter: {count} tensor(s) with a grad_fn survive from step to step, keeping their autograd "
        f"graphs alive (their saved tensors are invisible to the census): {fmt_group(g.dtype, g.shape)} on "
        f"{g.device} ({g.grad_fn}, {g.nodes} graph nodes), held by {holder}. Keep .item() or .detach() instead"
    )
