"""What a census found, as one immutable object the scrape thread may read without locks.

The training thread builds a new ``Findings`` after each census and swaps one attribute; the
``/debug/memory`` handler, the pre-mortem and ``memexporter inspect`` read it. Sizes in bytes,
rates per training step, times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memexporter.diagnose.autograd import Graph
from memexporter.diagnose.census import Census
from memexporter.diagnose.growth import Growth


@dataclass(frozen=True)
class Named:
    """A growing group and what holds it (most samples first)."""

    growth: Growth
    held_by: tuple[str, ...]


@dataclass(frozen=True)
class NamedGraph:
    """Tensors whose autograd graphs span censuses, and what holds them."""

    graph: Graph
    held_by: tuple[str, ...]


@dataclass(frozen=True)
class Findings:
    """The latest census, its growth and graphs, and a short history of earlier censuses."""

    census: Census
    growth: tuple[Named, ...]
    graphs: tuple[NamedGraph, ...]
    history: tuple[tuple[int, int, int, float], ...]  # (step, bytes, storages, duration_s), oldest first
    next_census_step: int
    cost_s: float = 0.0  # census + holder walk + graph walk, seconds
    reason: str = field(default="")


def _shape(shape: tuple[int, ...]) -> list[int]:
    return list(shape)


def to_json(f: Findings, top: int) -> dict[str, Any]:
    """The ``census``, ``growth`` and ``autograd`` parts of ``/debug/memory`` (``top``: census groups)."""
    c = f.census
    return {
        "census": {
            "step": c.step,
            "unix_time": c.unix_time,
            "duration_ms": round(1e3 * f.cost_s, 3),
            "tensors": c.tensors,
            "storages": c.storages,
            "bytes": c.bytes,
            "skipped": c.skipped,
            "groups_left_out": c.left_out + max(0, len(c.groups) - top),
            "by_kind": [{"device": d, "kind": k, "bytes": b} for d, k, b in c.by_kind],
            "groups": [
                {
                    "device": g.device,
                    "dtype": g.dtype,
                    "shape": _shape(g.shape),
                    "kind": g.kind,
                    "count": g.count,
                    "bytes": g.bytes,
                    "views": g.views,
                }
                for g in c.groups[:top]
            ],
        },
        "growth": [
            {
                "device": n.growth.key[0],
                "dtype": n.growth.key[1],
                "shape": _shape(n.growth.key[2]),
                "kind": n.growth.key[3],
                "count": n.growth.count,
                "bytes": n.growth.bytes,
                "count_per_step": n.growth.count_per_step,
                "bytes_per_step": n.growth.bytes_per_step,
                "since_step": n.growth.since_step,
                "censuses": n.growth.censuses,
                "held_by": list(n.held_by),
            }
            for n in f.growth
        ],
        "autograd": [
            {
                "device": g.graph.device,
                "dtype": g.graph.dtype,
                "shape": _shape(g.graph.shape),
                "grad_fn": g.graph.grad_fn,
                "count": g.graph.count,
                "graph_nodes": g.graph.nodes,
                "graph_nodes_capped": g.graph.capped,
                "held_by": list(g.held_by),
            }
            for g in f.graphs
        ],
        "history": [
            {"step": s, "bytes": b, "storages": n, "duration_ms": round(1e3 * d, 3)} for s, b, n, d in f.history
        ],
        "next_census_step": f.next_census_step,
    }
