"""The module ledger, on the training thread: the row plan of a model and its byte counting.

``track()`` builds a ``Plan`` once; the hooks in ``tracking/hooks.py`` and
``tracking/optimizer.py`` call the counting functions here and publish the results as an
immutable ``snapshots.Snapshot``, which is all the scrape thread reads (DESIGN.md §2 rule 4).

Bytes are storage bytes (``untyped_storage().nbytes()``), each storage counted once, keyed by
``untyped_storage().data_ptr()``: views and tied weights share a storage, so they count once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from memexporter.tracking.snapshots import ROOT_LABEL, Layout


def storage(t: torch.Tensor) -> tuple[int, int]:
    """``(identity, bytes)`` of the memory a tensor holds: its storage, so views count once."""
    if t.is_sparse:
        v, i = t._values(), t._indices()
        return id(t), v.numel() * v.element_size() + i.numel() * i.element_size()
    try:
        s = t.untyped_storage()
    except Exception:  # wrapper subclasses (DTensor) hold a local tensor; others: the logical size
        local = getattr(t, "_local_tensor", None)
        return storage(local) if isinstance(local, torch.Tensor) else (id(t), t.numel() * t.element_size())
    ptr = s.data_ptr()
    return (ptr, s.nbytes()) if ptr else (0, 0)  # meta or empty: holds no memory


def unwrap(model: nn.Module) -> tuple[nn.Module, bool]:
    """The module whose tree is reported under torch.compile / DDP wrappers, and if it is compiled."""
    inner, compiled = model, False
    while True:
        kind, children = type(inner).__name__, inner._modules
        if kind == "OptimizedModule" and isinstance(children.get("_orig_mod"), nn.Module):
            inner, compiled = children["_orig_mod"], True  # type: ignore[assignment]
        elif kind in ("DistributedDataParallel", "DataParallel") and isinstance(children.get("module"), nn.Module):
            inner = children["module"]  # type: ignore[assignment]
        else:
            return inner, compiled


Slot = tuple[dict[str, Any], str, int]


class Plan:
    """The module tree, read once at track time: candidate rows, hooked modules, tensor slots.

    Row 0 is the root; rows 1.. are the modules at most ``depth`` levels down, in pre-order.
    A deeper module belongs to its ancestor at ``depth``. Slots are ``(module._parameters or
    module._buffers, name, row)``, looked up on each use: a parameter replaced by ``.to()`` or
    ``load_state_dict(assign=True)`` is seen, and the old one is not kept alive.
    """

    def __init__(self, root: nn.Module, depth: int) -> None:
        self.paths, self.parents = [""], [-1]
        self.hooked: list[tuple[nn.Module, int]] = []
        index, row_of = {"": 0}, {}
        mods = list(root.named_modules())  # a module shared in two places is listed once
        for path, m in mods:
            parts = path.split(".") if path else []
            if 0 < len(parts) <= depth:
                index[path] = row_of[id(m)] = len(self.paths)
                self.parents.append(index[".".join(parts[:-1])])
                self.paths.append(path)
                self.hooked.append((m, row_of[id(m)]))
            else:
                row_of[id(m)] = index[".".join(parts[:depth])]
        self.params: list[Slot] = []
        self.buffers: list[Slot] = []
        seen: set[int] = set()
        for _, m in mods:
            for slots, tensors in ((self.params, m._parameters), (self.buffers, m._buffers)):
                for name, t in tensors.items():
                    if t is not None and id(t) not in seen:  # a tied weight belongs to its first owner
                        seen.add(id(t))
                        slots.append((tensors, name, row_of[id(m)]))
        self.slots = self.params + self.buffers

    def layout(self, prefix: str) -> Layout:
        names = tuple((f"{prefix}.{p}" if prefix else p) if p else (prefix or ROOT_LABEL) for p in self.paths)
        return Layout(names, tuple(self.parents))

    def fingerprint(self) -> tuple[int, ...]:
        """Data pointers of every parameter and buffer: changes when ``.to()``/``.half()`` moves them."""
        return tuple(0 if (t := d.get(k)) is None else t.data_ptr() for d, k, _ in self.slots)

    def tensors(self, slots: list[Slot]) -> list[tuple[torch.Tensor, int]]:
        return [(t, row) for d, k, row in slots if (t := d.get(k)) is not None]


@dataclass(frozen=True)
class ParamCount:
    """Parameter bytes per row, and what the hooks need to know about the parameters."""

    bytes: tuple[int, ...]
    exclude: frozenset[int]  # storage keys of parameters and buffers: not activations
    param_ids: frozenset[int]
    cuda_index: int | None  # device of the first CUDA parameter


def count_params(plan: Plan) -> ParamCount:
    out = [0] * len(plan.paths)
    seen = {0}
    params = plan.tensors(plan.params)
    for p, row in params:
        key, nbytes = storage(p)
        if key not in seen:
            seen.add(key)
            out[row] += nbytes
    seen.update(storage(b)[0] for b, _ in plan.tensors(plan.buffers))
    cuda = [p.device.index or 0 for p, _ in params if p.device.type == "cuda"]
    return ParamCount(tuple(out), frozenset(seen), frozenset(id(p) for p, _ in params), cuda[0] if cuda else None)


def _add(t: torch.Tensor, seen: set[int], out: list[int], row: int) -> None:
    try:  # the fast path of storage(), inlined: this runs for every tensor at every counted step
        st = t.untyped_storage()
        key, nbytes = st.data_ptr(), st.nbytes()
    except Exception:
        key, nbytes = storage(t)
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
