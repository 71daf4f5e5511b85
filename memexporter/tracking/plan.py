"""The row plan of a tracked model, read once at ``track()``: rows, hooked modules, tensor slots.

Rows follow what a reader of the model calls its layers, not how frameworks wrap them:

- **Wrappers are transparent.** A child reached through a wrapper attribute
  (``_orig_mod`` of ``torch.compile``, ``_fsdp_wrapped_module`` of FSDP1,
  ``_checkpoint_wrapped_module`` of activation checkpointing, ``module`` of DDP/DataParallel/
  DeepSpeed) shares its wrapper's row: the wrapper part never shows in a label or spends a level
  of depth.
- **Containers are seen through.** ``ModuleList``/``ModuleDict`` have no ``forward``: hooks on
  them never run. Where the depth cut falls on a container, its children get the hooks, with the
  container's row, so one layer's parameters and activations always land in the same row.
- **A compiled submodule is a leaf.** Everything under a ``torch.compile``'d submodule belongs to
  its row: hooks inside a compiled region would run at trace time, and adding or removing them
  would make Dynamo recompile.

``hooked`` lists ``(module, row)`` for every module whose forward is hooked; ``entries`` are the
hooked modules with no hooked ancestor but the root: where a training step may enter the model
without calling the root (a ``LightningModule`` whose ``training_step`` calls ``self.net``).
``repeated`` are the rows of repeated blocks: two or more siblings of one class, numbered as the
children of a ``ModuleList`` or ``Sequential`` are (``blocks.0``, ``blocks.1``), each with layers of
its own (two ``Linear`` in a ``Sequential`` are layers, not blocks); their recorded forwards also
measure their inputs, what activation checkpointing would keep (``oom/levers.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from memexporter.tracking.snapshots import ROOT_LABEL, Layout

# Attributes that hold the wrapped module, whatever the wrapper's class.
WRAPPED_ATTRS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})
# ``module`` is a wrapper attribute only on these classes: a user's own child may be named so.
MODULE_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel", "DeepSpeedEngine", "FullyShardedDataParallel"})
COMPILED = "OptimizedModule"


_PLAIN = (nn.Parameter, torch.Tensor)


def data_ptr(t: torch.Tensor) -> int:
    """``t.data_ptr()``, of the local shard for a DTensor (which has none of its own); 0 if none."""
    if type(t) not in _PLAIN:  # a subclass (DTensor): the attribute lookup costs a microsecond
        t = getattr(t, "_local_tensor", t)
    try:
        return int(t.data_ptr())
    except Exception:  # meta, fake and other storage-less tensors
        return 0


def _wrapped(parent: nn.Module, name: str) -> bool:
    return name in WRAPPED_ATTRS or (name == "module" and type(parent).__name__ in MODULE_WRAPPERS)


def peel(model: nn.Module) -> tuple[nn.Module, list[nn.Module]]:
    """The module whose tree is reported, and the wrappers peeled off to reach it (outermost first)."""
    chain: list[nn.Module] = []
    inner = model
    while True:
        wrapped = [m for name, m in inner._modules.items() if m is not None and _wrapped(inner, name)]
        if len(wrapped) != 1 or len(inner._modules) != 1:
            return inner, chain
        chain.append(inner)
        inner = wrapped[0]


def unwrap(model: nn.Module) -> tuple[nn.Module, bool]:
    """The module whose tree is reported (wrappers at the root peeled off), and if it is compiled."""
    inner, chain = peel(model)
    return inner, any(type(w).__name__ == COMPILED for w in chain)


Slot = tuple[dict[str, Any], str, int]


def repeated(paths: list[str], parents: list[int], classes: list[str], nested: set[int]) -> frozenset[int]:
    """The rows of repeated blocks (module docstring): numbered siblings with layers of their own, two or
    more of one class."""
    groups: dict[tuple[int, str], list[int]] = {}
    for i in range(1, len(paths)):
        if i in nested and paths[i].rpartition(".")[2].isdecimal():
            groups.setdefault((parents[i], classes[i]), []).append(i)
    return frozenset(i for rows in groups.values() if len(rows) > 1 for i in rows)


class Plan:
    """Candidate rows, hooked modules and tensor slots of one model (see the module docstring).

    Row 0 is the root; rows 1.. are the modules at most ``depth`` levels down (wrappers not
    counted), in pre-order. A deeper module belongs to its ancestor at ``depth``. Slots are
    ``(module._parameters or module._buffers, name, row)``, looked up on each use: a parameter
    replaced by ``.to()``, ``load_state_dict(assign=True)`` or ``fully_shard`` is seen, and the old
    one is not kept alive.
    """

    def __init__(self, root: nn.Module, depth: int, outer: list[nn.Module] | None = None) -> None:
        """``outer``: wrappers peeled off ``root`` (``peel``); what they hold themselves (FSDP1's
        flat parameter with ``use_orig_params=False``) belongs to the root row."""
        self.paths, self.parents, self.classes = [""], [-1], [type(root).__name__]
        self._nested: set[int] = set()  # rows whose module has submodules (a block, not a layer)
        self.hooked: list[tuple[nn.Module, int]] = []
        self.entries: list[tuple[nn.Module, int]] = []
        self._depth = depth
        self._row_of: dict[int, int] = {id(m): 0 for m in (*(outer or ()), root)}
        self._order: list[nn.Module] = [*(outer or ()), root]
        self._walk(root, (), 0, see_through=False, top=True)
        self.params: list[Slot] = []
        self.buffers: list[Slot] = []
        seen: set[int] = set()
        for m in self._order:
            for slots, tensors in ((self.params, m._parameters), (self.buffers, m._buffers)):
                for name, t in tensors.items():
                    if t is not None and id(t) not in seen:  # a tied weight belongs to its first owner
                        seen.add(id(t))
                        slots.append((tensors, name, self._row_of[id(m)]))
        self.slots = self.params + self.buffers
        self.repeated = repeated(self.paths, self.parents, self.classes, self._nested)

    def _walk(self, parent: nn.Module, parts: tuple[str, ...], row: int, see_through: bool, top: bool) -> None:
        """Assign rows and hooks below ``parent`` (clean path ``parts``, row ``row``).

        ``see_through``: ``parent`` is a container at or past the cut whose children take its row
        and its hooks. ``top``: no hooked module between the root and ``parent`` yet.
        """
        for name, child in parent._modules.items():
            if child is None or id(child) in self._row_of:  # a module shared in two places: first path
                continue
            self._order.append(child)
            if _wrapped(parent, name):  # the wrapper's row, hooks and all (the wrapper was hooked)
                self._row_of[id(child)] = row
                self._walk(child, parts, row, see_through, top)
                continue
            child_parts = (*parts, name)
            container = isinstance(child, (nn.ModuleList, nn.ModuleDict))
            if len(child_parts) <= self._depth:
                child_row = len(self.paths)
                self.paths.append(".".join(child_parts))
                self.parents.append(row)
                self.classes.append(type(child).__name__)
                if child._modules:
                    self._nested.add(child_row)
            else:
                child_row = row
            self._row_of[id(child)] = child_row
            hooked = not container and (child_row != row or see_through)
            if hooked:
                self.hooked.append((child, child_row))
                if top:
                    self.entries.append((child, child_row))
            if type(child).__name__ == COMPILED:  # a leaf: its whole subtree is this row, unhooked
                self._claim(child, child_row)
                continue
            deeper_see_through = container and (child_row != row or see_through)
            self._walk(child, child_parts, child_row, deeper_see_through, top and not hooked)

    def _claim(self, module: nn.Module, row: int) -> None:
        for m in module.modules():
            if id(m) not in self._row_of:
                self._row_of[id(m)] = row
                self._order.append(m)

    def layout(self, prefix: str) -> Layout:
        names = tuple((f"{prefix}.{p}" if prefix else p) if p else (prefix or ROOT_LABEL) for p in self.paths)
        return Layout(names, tuple(self.parents), tuple(self.classes), self.repeated)

    def fingerprint(self) -> tuple[tuple[int, int], ...]:
        """Identity and data pointer of every parameter and buffer: changes when ``.to()`` or
        ``.half()`` moves one (same object, new data) or ``fully_shard`` replaces one."""
        return tuple((id(t), data_ptr(t)) for d, k, _ in self.slots if (t := d.get(k)) is not None)

    def tensors(self, slots: list[Slot]) -> list[tuple[torch.Tensor, int]]:
        return [(t, row) for d, k, row in slots if (t := d.get(k)) is not None]
