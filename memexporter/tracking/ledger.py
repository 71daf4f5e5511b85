"""The module ledger, on the training thread: byte counting over a ``plan.Plan``.

The hooks in ``tracking/forward.py`` and ``tracking/gradients.py`` call the counting functions here
and publish the results as an immutable ``snapshots.Snapshot``, which is all the scrape thread
reads (DESIGN.md §2 rule 4).

Bytes follow storage, each piece of memory counted once, by each framework's rules
(``tracking/storage/``): torch's own tensors (``plain``), DTensors (``dtensor``: FSDP2, tensor
parallel, the local shard), DeepSpeed (``deepspeed``: a ZeRO-3 parameter's partition; ``zero``:
the flat partitions, counted in ``tracking/partitions.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.optim import Optimizer

from memexporter.tracking.plan import Plan
from memexporter.tracking.storage import deepspeed, dtensor
from memexporter.tracking.storage.dtensor import local
from memexporter.tracking.storage.plain import owned, storage

__all__ = ["ParamCount", "count_params", "count_step", "local", "owned", "storage"]


@dataclass(frozen=True)
class ParamCount:
    """Parameter bytes per row, and what the hooks need to know about the parameters."""

    bytes: tuple[int, ...]  # local bytes: what this rank holds
    unsharded: tuple[int, ...] | None  # global bytes of sharded parameters; None: nothing sharded
    exclude: frozenset[int]  # storage keys of parameters and buffers: not activations
    param_ids: frozenset[int]
    cuda_index: int | None  # device of the first CUDA parameter
    failed: int = 0  # tensors that could not be read (skipped)
    # ZeRO-3 models only: (device, bytes per row) of the partitions (offload_param puts them on the host).
    placement: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    absent: str | None = None  # why the parameter rows are left out (DeepSpeed's structures differ)
    fp32: tuple[int, ...] = ()  # the part of ``bytes`` held in float32, per row (the bf16 lever)


def share(p: torch.Tensor) -> tuple[torch.Tensor, int | None]:
    """``(the tensor this rank holds for p, p's unsharded bytes or None if p is whole here)``, by
    the framework rules: a DTensor's local shard, a ZeRO-3 parameter's partition, else ``p``."""
    return dtensor.sharded(p) or deepspeed.partition(p) or (p, None)


def count_params(plan: Plan) -> ParamCount:
    """Parameter bytes per row (each held tensor's own bytes, once), and their unsharded size if sharded.

    A tensor that cannot be read is skipped and counted in ``failed``: ``track()`` must never raise.
    A ZeRO-3 parameter without DeepSpeed's marks as expected leaves the rows out (``absent``).
    """
    n = len(plan.paths)
    out, full, fp32 = [0] * n, [0] * n, [0] * n
    devices: dict[str, list[int]] = {}
    seen, exclude = {0}, {0}
    sharded, zero3, failed, cuda, absent = False, False, 0, None, None
    params = plan.tensors(plan.params)
    for p, row in params:
        try:
            held, whole = share(p)
            key, nbytes = owned(held)
            exclude.add(storage(p)[0])
            sharded = sharded or whole is not None
            zero3 = zero3 or (held is not p and hasattr(p, "ds_id"))
            if key not in seen:
                seen.add(key)
                out[row] += nbytes
                full[row] += nbytes if whole is None else whole
                fp32[row] += nbytes if held.dtype == torch.float32 else 0
                devices.setdefault(str(held.device), [0] * n)[row] += nbytes
            if cuda is None and p.device.type == "cuda":
                cuda = p.device.index or 0
        except deepspeed.Unsupported as exc:
            absent = deepspeed.absent(str(exc))
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
        tuple((d, tuple(v)) for d, v in sorted(devices.items())) if zero3 else None,
        absent,
        tuple(fp32),
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
