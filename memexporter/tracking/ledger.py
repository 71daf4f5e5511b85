"""The module ledger, on the training thread: byte counting over a ``plan.Plan``.

The hooks in ``tracking/forward.py`` and ``tracking/gradients.py`` call the counting functions here
and publish the results as an immutable ``snapshots.Snapshot``, which is all the scrape thread
reads (DESIGN.md §2 rule 4).

Bytes follow storage, each piece of memory counted once:

- parameters, gradients and optimizer state count their **own** bytes (``owned``): a tied weight
  is one tensor, counted once; a view into a shared bucket is charged to its own parameter;
- saved activations count the **whole storage** they keep alive (``storage``), once per forward;
- a DTensor (FSDP2, tensor parallel) counts its local shard: what this rank holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.optim import Optimizer

from memexporter.tracking.plan import Plan


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory this rank holds: a DTensor's local shard (FSDP2, tensor parallel)."""
    while True:
        inner = getattr(t, "_local_tensor", None)
        if not isinstance(inner, torch.Tensor):
            return t
        t = inner


def storage(t: torch.Tensor) -> tuple[int, int]:
    """``(identity, bytes)`` of the memory a tensor holds alive: its whole storage, so views count
    once. For activations: a saved view keeps its whole storage alive."""
    t = local(t)
    if t.is_sparse:
        v, i = t._values(), t._indices()
        return id(t), v.numel() * v.element_size() + i.numel() * i.element_size()
    try:
        s = t.untyped_storage()
        ptr = s.data_ptr()
    except Exception:  # other wrapper subclasses and storage-less tensors: the logical size
        return id(t), t.numel() * t.element_size()
    return (ptr, s.nbytes()) if ptr else (0, 0)  # meta or empty: holds no memory


def owned(t: torch.Tensor) -> tuple[int, int]:
    """``(identity, bytes)`` of a parameter, gradient or optimizer-state tensor: its own bytes.

    A view into a shared buffer (DDP's ``gradient_as_bucket_view``, a flat parameter) counts its
    own elements, keyed by its first element's address, so each parameter is charged for its own
    slice and the buffer is counted once in pieces. Never more than the storage holds (an
    expanded tensor). A DTensor counts its local shard.
    """
    t = local(t)
    if t.is_sparse:
        return storage(t)
    try:
        ptr, cap = t.data_ptr(), t.untyped_storage().nbytes()
    except Exception:
        return id(t), t.numel() * t.element_size()
    return (ptr, min(t.numel() * t.element_size(), cap)) if ptr else (0, 0)


@dataclass(frozen=True)
class ParamCount:
    """Parameter bytes per row, and what the hooks need to know about the parameters."""

    bytes: tuple[int, ...]  # local bytes: what this rank holds
    unsharded: tuple[int, ...] | None  # global bytes of DTensor parameters; None: nothing sharded
    exclude: frozenset[int]  # storage keys of parameters and buffers: not activations
    param_ids: frozenset[int]
    cuda_index: int | None  # device of the first CUDA parameter
    failed: int = 0  # tensors that could not be read (skipped)


def count_params(plan: Plan) -> ParamCount:
    """Parameter bytes per row (each tensor's own bytes, once), and their unsharded size if sharded.

    A tensor that cannot be read is skipped and counted in ``failed``: ``track()`` must never raise.
    """
    out, full = [0] * len(plan.paths), [0] * len(plan.paths)
    seen, exclude = {0}, {0}
    sharded, failed, cuda = False, 0, None
    params = plan.tensors(plan.params)
    for p, row in params:
        try:
            key, nbytes = owned(p)
            exclude.add(storage(p)[0])
            is_dtensor = local(p) is not p
            sharded = sharded or is_dtensor
            if key not in seen:
                seen.add(key)
                out[row] += nbytes
                full[row] += p.numel() * p.element_size() if is_dtensor else nbytes
            if cuda is None and p.device.type == "cuda":
                cuda = p.device.index or 0
        except Exception:
            failed += 1
    for b, _ in plan.tensors(plan.buffers):
        try:
            exclude.add(storage(b)[0])
        except Exception:
            failed += 1
    return ParamCount(
        tuple(out),
        tuple(full) if sharded else None,
        frozenset(exclude),
        frozenset(id(p) for p, _ in params),
        cuda,
        failed,
    )


def _add(t: torch.Tensor, seen: set[int], out: list[int], row: int) -> None:
    key, nbytes = owned(t)
    if key not in seen:
        seen.add(key)
        out[row] += nbytes


def count_step(plan: Plan, optimizer: Optimizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(gradient bytes, optimizer-state bytes)`` per row: ``.grad`` and ``optimizer.state[p]``."""
    n = len(plan.paths)
    grads, state = [0] * n, [0] * n
    seen_g, seen_s = {0}, {0}
    states = optimizer.state
    for p, row in plan.tensors(plan.params):
        g = p.grad
        if g is not None:
            _add(g, seen_g, grads, row)
        # `in` first: optimizer.state is a defaultdict, a plain lookup would insert.
        for v in states[p].values() if p in states else ():
            if isinstance(v, torch.Tensor):
                _add(v, seen_s, state, row)
    return tuple(grads), tuple(state)
