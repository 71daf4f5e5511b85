"""DeepSpeed ZeRO's flat partitions, mapped back to the model's parameters by DeepSpeed's own offsets.

Under ZeRO 1, 2 and 3, DeepSpeed's torch optimizer steps flat fp32 partitions, one per parameter
group (a sub-group under ZeRO-3), not the model's parameters. What this rank holds for a
parameter is its **fragment** of each: fp32 master weights (the flat tensor), the optimizer's state
of the flat tensor (Adam's ``exp_avg``, ``exp_avg_sq``), and the flat gradient partition the step
consumes (the flat tensor's ``.grad``). The fragments are DeepSpeed's map, never re-derived:

- ZeRO 1, 2: ``param._hp_mapping`` (``tensor_fragment``): ``hp_fragment`` is a narrow view of the
  flat partition (``hp_fragment._base``), ``hp_fragment_address.numel`` its length; ``None`` when
  none of the parameter is on this rank;
- ZeRO-3: ``param._z3_optimizer.grad_position[param_id] = [sub-group, offset, numel]`` into
  ``fp32_partitioned_groups_flat[sub-group]`` (what ``safe_get_local_fp32_param`` reads; the
  accessors themselves wait for DeepSpeed's stream and copy to the device, so they are not called).

``build`` reads the map once, at an optimizer step (never in a forward or backward hook), and again
when DeepSpeed rebuilt its partitions (``fingerprint`` changed). ``count`` runs in the step hook of
each flat partition, while its gradient is there. Elements of a partition that no fragment claims
(alignment padding) and state that is not per element (Adam's ``step``) go to the root row, so each
family's rows add up to what DeepSpeed holds.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memexporter.tracking.storage.deepspeed import Unsupported

__all__ = ["FlatCount", "Share", "ZeroMap", "build", "count", "fingerprint"]


@dataclass(frozen=True)
class Share:
    """One flat partition of this rank and the rows its elements belong to."""

    flat: weakref.ref[torch.Tensor]
    elements: int  # of the partition, padding included
    rows: tuple[tuple[int, int], ...]  # (row, elements of that row's parameters' fragments)


@dataclass(frozen=True)
class ZeroMap:
    """The fragments of one model on this rank: ``shares`` by ``id()`` of the flat partition."""

    stage: int  # 3, or 2 for the fragment map that ZeRO 1 and 2 share
    shares: dict[int, Share]
    fingerprint: tuple[int, ...]


@dataclass(frozen=True)
class FlatCount:
    """Bytes per row held for one flat partition: ``(row, bytes)`` pairs, and the device of each family."""

    gradient: tuple[tuple[int, int], ...]
    optimizer_state: tuple[tuple[int, int], ...]
    gradient_device: str
    state_device: str


def fingerprint(params: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """What changes when DeepSpeed rebuilds its partitions (re-links fragments, new flat tensors)."""
    p = params[0] if params else None
    z3 = getattr(p, "_z3_optimizer", None)
    if z3 is not None:
        flats = getattr(z3, "fp32_partitioned_groups_flat", ())
        return (3, id(z3), id(getattr(z3, "grad_position", None)), *(id(f) for f in flats))
    return (2, *(id(getattr(q, "_hp_mapping", None)) for q in params))


def build(params: Sequence[tuple[torch.Tensor, int]]) -> ZeroMap | None:
    """The fragment map of ``params`` (``(parameter, row)``), None when no parameter is ZeRO's.
    Raises ``Unsupported`` when DeepSpeed's marks are there but not as 0.19 lays them out."""
    stage, rows, flats = 0, dict[int, dict[int, int]](), dict[int, torch.Tensor]()
    for p, row in params:
        if hasattr(p, "ds_id"):
            stage = 3
            found = _z3_fragment(p)
        elif hasattr(p, "_hp_mapping"):
            stage = stage or 2
            found = _fragment(p)
        else:
            continue
        if found is not None:
            flat, n = found
            flats[id(flat)] = flat
            per_row = rows.setdefault(id(flat), {})
            per_row[row] = per_row.get(row, 0) + n
    if not stage:
        return None
    shares = {}
    for key, flat in flats.items():
        claimed = sum(rows[key].values())
        if claimed > flat.numel():
            raise Unsupported(f"fragments claim {claimed} elements of a flat partition of {flat.numel()}")
        shares[key] = Share(weakref.ref(flat), flat.numel(), tuple(sorted(rows[key].items())))
    return ZeroMap(stage, shares, fingerprint([p for p, _ in params]))


def _fragment(p: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    mapping: Any = p._hp_mapping  # type: ignore[attr-defined]
    if mapping is None:  # no element of p in this rank's partition
        return None
    frag = getattr(mapping, "hp_fragment", None)
    address = getattr(mapping, "hp_fragment_address", None)
    if not isinstance(frag, torch.Tensor) or not isinstance(getattr(address, "numel", None), int):
        raise Unsupported("param._hp_mapping has no hp_fragment tensor with an hp_fragment_address")
    flat = frag._base if frag._base is not None else frag
    return flat, int(address.numel)  # type: ignore[union-attr]


def _z3_fragment(p: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    z3: Any = getattr(p, "_z3_optimizer", None)
    if z3 is None:
        return None  # no optimizer over it (inference, or not initialised yet)
    try:
        group, _, n = z3.grad_position[z3.get_param_id(p)]
        flat = z3.fp32_partitioned_groups_flat[group]
    except KeyError:
        if not p.requires_grad:
            return None  # frozen: not in the optimizer
        raise Unsupported("a trainable ZeRO-3 parameter has no grad_position") from None
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        raise Unsupported(f"ZeRO-3 optimizer without grad_position / fp32_partitioned_groups_flat ({exc})") from None
    if not isinstance(flat, torch.Tensor):
        raise Unsupported("fp32_partitioned_groups_flat holds no tensor")
    return flat, int(n)


def count(share: Share, flat: torch.Tensor, state: dict[Any, Any]) -> FlatCount:
    """Bytes per row for one flat partition, read while its optimizer steps it: the gradient
    partition (``flat.grad``), the fp32 master weights (``flat``) and per-element optimizer state
    (``state``: the torch optimizer's ``state[flat]``). Elements no fragment claims, and state that
    is not per element, go to row 0 (the root)."""
    grad = flat.grad
    grad_size = grad.element_size() if grad is not None else flat.element_size()
    state_size, other = flat.element_size(), 0
    for v in state.values():
        if isinstance(v, torch.Tensor):
            if v.numel() == share.elements:
                state_size += v.element_size()
            else:
                other += v.numel() * v.element_size()
    rest = share.elements - sum(n for _, n in share.rows)
    gradient = [(row, n * grad_size) for row, n in share.rows] + [(0, rest * grad_size)]
    optimizer_state = [(row, n * state_size) for row, n in share.rows] + [(0, rest * state_size + other)]
    device = str(grad.device if grad is not None else flat.device)
    return FlatCount(tuple(gradient), tuple(optimizer_state), device, str(flat.device))
