"""The tensor census: live tensors grouped by device, dtype, shape and kind, each storage once.

Taken on the training thread at a step boundary, never on the scrape thread: reading ``.grad``
and optimizer state while autograd writes them races in C++ (DESIGN.md §2 rule 4). Live tensors
come from ``gc.get_objects()`` (every tensor with a Python object), plus the ``.grad`` of every
leaf that requires grad (a gradient may have no Python object of its own). Bytes are storage
bytes (``untyped_storage().nbytes()``), keyed by the storage's device and ``data_ptr()``, so a
view, a tied weight or a parameter that is also an optimizer's key counts once.

Kinds, in priority order (a storage that is both a parameter and elsewhere a plain tensor is a
parameter): ``parameter`` (``nn.Parameter``), ``gradient`` (a leaf's ``.grad``),
``optimizer_state`` (a tensor in any ``Optimizer.state``), ``other``. A storage takes the
device, dtype and shape of its largest visible tensor. A view keeps its base tensor alive
(``view._base``), so a leaked slice of a batch shows up as the whole batch; a tensor that shares a
storage without a base (``set_()``, ``from_file``) reports its own shape but the bytes of the
whole storage (``views`` counts those).

Saved tensors of autograd graphs have no Python object: they are measured by ``autograd.py``.
"""

from __future__ import annotations

import gc
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim import Optimizer

KINDS = ("parameter", "gradient", "optimizer_state", "other")
PARAMETER, GRADIENT, OPTIMIZER_STATE, OTHER = range(4)

MAX_GROUPS = 256
"""Groups kept per census, largest first; the rest are summed in ``Census.bytes`` only."""
NEW_SAMPLES = 4
"""Tensors per group, among those new since the last census, kept for the holder walk."""
MAX_KEYS = 200_000
"""Storage keys remembered for the next census (to tell new tensors); beyond that, none are."""
MAX_GRAPH_ROOTS = 512
"""Tensors with a ``grad_fn`` handed to the autograd check, at most."""

StorageKey = tuple[str, int, int]  # device, data_ptr (id for an empty storage), bytes
GroupKey = tuple[str, str, tuple[int, ...], str]  # device, dtype, shape, kind


@dataclass(frozen=True)
class Group:
    """Storages whose largest tensor has this device, dtype, shape and kind. Bytes are storage bytes."""

    device: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    count: int
    bytes: int
    views: int = 0

    @property
    def key(self) -> GroupKey:
        return (self.device, self.dtype, self.shape, self.kind)


@dataclass(frozen=True)
class Census:
    """One census, immutable (published to the scrape thread). Times in seconds, sizes in bytes.

    ``tensors``: tensor objects seen; ``storages``/``bytes``: distinct storages and their bytes;
    ``skipped``: tensors without a readable storage (wrapper subclasses, sparse); ``groups``:
    largest first, at most ``MAX_GROUPS`` (``left_out`` more exist); ``by_kind``: bytes per
    ``(device, kind)``.
    """

    step: int
    unix_time: float
    duration_s: float
    tensors: int
    storages: int
    bytes: int
    skipped: int
    groups: tuple[Group, ...]
    left_out: int
    by_kind: tuple[tuple[str, str, int], ...]

    def counts(self) -> dict[GroupKey, tuple[int, int]]:
        """``{group key: (count, bytes)}``, for the growth history."""
        return {g.key: (g.count, g.bytes) for g in self.groups}


@dataclass
class Scan:
    """A census plus what only the training thread may keep until the census is processed: live
    sample tensors (strong references: drop the scan promptly) and the storage keys seen."""

    census: Census
    keys: frozenset[StorageKey] | None
    samples: dict[GroupKey, list[Any]] = field(default_factory=dict)
    graph_roots: list[Any] = field(default_factory=list)
    key_of: dict[int, StorageKey] = field(default_factory=dict)  # id(sample) -> its storage key


def _subclasses(root: type) -> set[type]:
    out, stack = {root}, [root]
    while stack:
        sub: type
        for sub in stack.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                stack.append(sub)
    return out


def device_label(device: torch.device) -> str:
    """``cpu``, ``cuda:0``...: the ``device`` label of the metrics."""
    return device.type if device.index is None else f"{device.type}:{device.index}"


def storage_key(t: torch.Tensor) -> tuple[StorageKey, int]:
    """``((device, data_ptr, storage bytes), storage bytes)``; raises for tensors without a storage.

    The size is part of the key because allocators hand freed addresses back: a new storage where a
    smaller one was is new, and is a sample for the holder walk (one of the same size still is not).
    """
    s = t.untyped_storage()
    ptr, nbytes = s.data_ptr(), s.nbytes()
    label = device_label(t.device)
    return ((label, ptr, nbytes) if ptr else (label + "#empty", id(t), 0)), nbytes


def _live() -> tuple[list[torch.Tensor], list[Optimizer]]:
    tensor_types, optimizer_types = _subclasses(torch.Tensor), _subclasses(Optimizer)
    wanted = tensor_types | optimizer_types
    objs = gc.get_objects()
    try:
        # C-level filtering: a Python loop over ~300 000 objects costs several times more.
        found = list(itertools.compress(objs, map(wanted.__contains__, map(type, objs))))
    finally:
        del objs
    tensors = [o for o in found if type(o) in tensor_types]
    optimizers = [o for o in found if type(o) in optimizer_types]
    return tensors, optimizers


def take(step: int, previous: frozenset[StorageKey] | None) -> Scan:
    """Take a census now (training thread). ``previous``: the last census's storage keys, if any."""
    started = time.perf_counter()
    tensors, optimizers = _live()
    kind: dict[StorageKey, int] = {}
    for opt in optimizers:
        for state in list(opt.state.values()):
            for value in list(state.values()) if isinstance(state, dict) else ():
                if isinstance(value, torch.Tensor):
                    k, _ = storage_key(value)
                    kind[k] = min(kind.get(k, OTHER), OPTIMIZER_STATE)
    grads: list[torch.Tensor] = []
    for t in tensors:
        try:
            if t.is_leaf and t.requires_grad and t.grad is not None:
                grads.append(t.grad)
        except Exception:  # exotic subclasses: the storage check below counts them
            continue
    # storage key -> [kind, visible bytes of the largest tensor, that tensor, storage bytes]
    best: dict[StorageKey, list[Any]] = {}
    skipped, roots = 0, list[torch.Tensor]()
    for t in itertools.chain(tensors, grads):
        try:
            if t.device.type == "meta":
                continue
            k, nbytes = storage_key(t)
            rank = PARAMETER if isinstance(t, torch.nn.Parameter) else kind.get(k, OTHER)
            if t.grad_fn is not None and len(roots) < MAX_GRAPH_ROOTS:
                roots.append(t)
            visible = t.numel() * t.element_size()
        except Exception:
            skipped += 1
            continue
        seen = best.get(k)
        if seen is None:
            best[k] = [rank, visible, t, nbytes]
        elif (rank, -visible) < (seen[0], -seen[1]):
            seen[0], seen[1], seen[2] = rank, visible, t
    for t in grads:
        try:
            seen = best.get(storage_key(t)[0])
        except Exception:  # already counted as skipped above
            continue
        if seen is not None and seen[0] > GRADIENT:
            seen[0] = GRADIENT
    return _summarise(step, started, len(tensors) + len(grads), skipped, best, previous, roots)


def _summarise(
    step: int,
    started: float,
    seen: int,
    skipped: int,
    best: dict[StorageKey, list[Any]],
    previous: frozenset[StorageKey] | None,
    roots: list[Any],
) -> Scan:
    groups: dict[GroupKey, list[int]] = {}
    by_kind: dict[tuple[str, str], int] = {}
    samples: dict[GroupKey, list[Any]] = {}
    key_of: dict[int, StorageKey] = {}
    total = 0
    for k, (rank, visible, t, nbytes) in best.items():
        gkey: GroupKey = (k[0].removesuffix("#empty"), str(t.dtype).removeprefix("torch."), tuple(t.shape), KINDS[rank])
        row = groups.setdefault(gkey, [0, 0, 0])
        row[0] += 1
        row[1] += nbytes
        row[2] += visible < nbytes
        total += nbytes
        by_kind[(gkey[0], gkey[3])] = by_kind.get((gkey[0], gkey[3]), 0) + nbytes
        picks = samples.setdefault(gkey, [])
        # New tensors name the holder of the growth best; with no previous census, any will do.
        if len(picks) < NEW_SAMPLES and (previous is None or k not in previous):
            picks.append(t)
            key_of[id(t)] = k
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
    census = Census(
        step=step,
        unix_time=time.time(),
        duration_s=time.perf_counter() - started,
        tensors=seen,
        storages=len(best),
        bytes=total,
        skipped=skipped,
        groups=tuple(Group(*key, count=c, bytes=b, views=v) for key, (c, b, v) in ordered[:MAX_GROUPS]),
        left_out=max(0, len(ordered) - MAX_GROUPS),
        by_kind=tuple(sorted(((d, kd, b) for (d, kd), b in by_kind.items()), key=lambda r: -r[2])),
    )
    keys = frozenset(best) if len(best) <= MAX_KEYS else None
    return Scan(census, keys, {g: s for g, s in samples.items() if s}, roots, key_of)
