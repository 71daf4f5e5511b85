"""What would make it fit: the levers, each sized from the job's own rows, pure (rows in, levers out).

Each lever is an estimate of the bytes it frees at the step peak, with its basis in words, checked in
the test suite against a real run that applies it (tests/integration/test_levers_cpu.py, and the
sharded launch of tests/integration/distributed/). ``collectors/levers.py`` gathers the inputs off the
training thread (the published module ``Snapshot``, the world size, the capacity, the stranded-memory
advice, a census's named growth) and ranks the list for every surface.

- **stranded**: ``oom/advice.py``'s bytes stranded in partly used segments (expandable segments).
- **checkpointing** the repeated blocks (``plan.Plan.repeated``: numbered siblings of one class with
  layers of their own; the group whose activations are largest): the bytes they save for backward,
  less what checkpointing keeps: each block's inputs, and one block's recompute at a time (the
  largest, less its input, which is already kept), beyond what backward has freed by then.
- **input**: the largest input that fits (``oom/capacity.py``); it frees the peak above that input.
- **sharding** the optimizer state over the N data-parallel ranks (ZeRO-1/2, FSDP2's ``fully_shard``):
  the optimizer rows x (1 - 1/N). Where the rows are already sharded, it says by what, and frees 0.
- **precision**: parameters and gradients in bf16 where they are float32: those bytes halved (each
  row's gradients taken in the share of its parameters that is float32).
- **leak**: a census's growing group and its holder: it frees what the group holds now, and the ETA
  runs on the leak that is left.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from memexporter.oom.advice import REMEDY, Advice
from memexporter.oom.capacity import Capacity
from memexporter.tracking.snapshots import Snapshot
from memexporter.units import fmt_bytes, fmt_duration

__all__ = ["TRACK", "Lever", "checkpointing", "input_lever", "leak", "precision", "ranked", "sharding", "stranded"]

TRACK = "track() the model to see this"
"""What a lever that needs the per-module rows says when no model is tracked."""
FIXED = 0.05
"""A leak left under 5 % of the one measured counts as fixed: nothing else grows. The two rates come from
different samplings (the baseline at every step, the census every ``census_every`` steps), so a job whose
whole leak is the named group leaves a few per cent either way (the leaking demo: under 1 %)."""


@dataclass(frozen=True)
class Lever:
    """One way to make the job fit: ``kind``, on ``device``, what to do (``action``) and the ``freed_bytes``
    it would likely free at the step peak (None: ``TRACK``), an estimate made as ``basis`` says;
    ``capacity_elements``: the largest input that then fits (None where no input capacity applies)."""

    kind: str
    device: str
    action: str
    freed_bytes: float | None
    basis: str
    capacity_elements: float | None = None

    def describe(self) -> str:
        """One line: what to do, what it frees, what fits then, and that it is an estimate."""
        if self.freed_bytes is None:
            return f"{self.kind}: {self.action}: {TRACK}"
        if not self.freed_bytes:
            return f"{self.kind}: {self.action}: frees nothing more ({self.basis})"
        elements = self.capacity_elements if self.fits else None
        fits = f"; the input then fits up to {int(elements):,} elements" if elements is not None else ""
        # "frees": the figure is what the lever takes off the step peak, not the peak (the input lever's
        # "declared 65,536: will not fit: ~116.0 GiB at the step peak" read as a peak of 116 GiB).
        freed = fmt_bytes(self.freed_bytes)
        return f"{self.kind}: {self.action}: frees ~{freed} at the step peak{fits} (estimate: {self.basis})"

    @property
    def fits(self) -> bool:
        return self.capacity_elements is not None and math.isfinite(self.capacity_elements)

    def to_json(self) -> dict[str, Any]:
        """The lever in ``/debug/memory`` and the pre-mortem (``inspect`` reads it back)."""
        return {
            "kind": self.kind,
            "device": self.device,
            "action": self.action,
            "freed_bytes": self.freed_bytes,
            "estimate": True,
            "basis": self.basis,
            "capacity_elements": self.capacity_elements if self.fits else None,
            "text": self.describe(),
        }


def ranked(levers: Iterable[Lever], cap: Capacity | None = None) -> tuple[Lever, ...]:
    """Largest first (those without a figure last), each with the capacity it leaves (``cap``)."""
    out = [lever if cap is None or lever.kind == "input" else _with_capacity(lever, cap) for lever in levers]
    return tuple(sorted(out, key=lambda v: (v.freed_bytes is None, -(v.freed_bytes or 0.0), v.kind)))


def _with_capacity(lever: Lever, cap: Capacity) -> Lever:
    if lever.freed_bytes is None or lever.freed_bytes <= 0 or lever.device != cap.device:
        return lever
    return replace(lever, capacity_elements=cap.after(lever.freed_bytes, scales=lever.kind == "checkpointing"))


def stranded(advice: Advice) -> Lever:
    """Expandable segments give back what is stranded now (``oom/advice.py``)."""
    return Lever(
        "stranded",
        advice.device,
        f"set {REMEDY}",
        advice.recoverable_bytes,
        "bytes stranded now in partly used segments of the native allocator, and growing",
    )


def _groups(snap: Snapshot) -> dict[tuple[int, str], list[int]]:
    layout = snap.layout
    groups: dict[tuple[int, str], list[int]] = {}
    for i in sorted(layout.repeated):
        groups.setdefault((layout.parents[i], layout.classes[i]), []).append(i)
    return {k: rows for k, rows in groups.items() if len(rows) > 1}


def _subtrees(values: tuple[int, ...], parents: tuple[int, ...]) -> list[int]:
    """Each row's value plus its descendants' (a block's own row and its layers' rows): rows are in
    pre-order, so children come after their parent."""
    out = list(values)
    for i in range(len(out) - 1, 0, -1):
        out[parents[i]] += out[i]
    return out


def _after(rows: list[int], parents: tuple[int, ...], own: tuple[int, ...]) -> int:
    """The saves of the rows after the group's subtrees in pre-order (the modules that run after it, by
    the order the model defines them): backward frees them before it reaches the group."""
    inside, last = set(rows), max(rows)
    for j in range(min(rows) + 1, len(parents)):
        if parents[j] in inside:
            inside.add(j)
            last = j
    return sum(own[last + 1 :])


def checkpointing(snap: Snapshot, device: str) -> Lever | None:
    """Activation checkpointing of the repeated blocks whose activations are largest (module docstring).

    Without it the step peak holds every save; with it, the blocks keep their inputs and, during
    backward, one block's recompute at a time (the largest, less its input, already kept), of which
    only what exceeds the saves of the modules after the blocks (freed by then) adds to the peak."""
    parents = snap.layout.parents
    act, kept = _subtrees(snap.activation, parents), snap.inputs or (0,) * len(snap.activation)
    groups = _groups(snap)
    if not groups:
        return None
    (_, cls), rows = max(groups.items(), key=lambda kv: sum(act[i] for i in kv[1]))
    saved = sum(act[i] for i in rows)
    if saved <= 0:
        return None
    inputs = sum(kept[i] for i in rows)
    recompute = max(max(act[i] - kept[i], 0) for i in rows)
    extra = max(recompute - _after(rows, parents, snap.activation), 0)
    group = snap.layout.names[rows[0]].rpartition(".")[0] + ".*"
    return Lever(
        "checkpointing",
        device,
        f"checkpoint {group} ({len(rows)} x {cls}, {fmt_bytes(saved)} saved for backward)",
        float(max(saved - inputs - extra, 0)),
        "their saved-for-backward bytes in the last recorded forward, less each block's inputs (kept) "
        "and one block's recompute beyond what backward has freed by then",
    )


def sharding(snap: Snapshot, world_size: int, device: str) -> Lever | None:
    """The optimizer rows sharded over ``world_size`` data-parallel ranks; where they already are, by what."""
    state = float(sum(snap.optimizer_state))
    if state <= 0 or world_size <= 1:
        return None
    by = "DeepSpeed ZeRO" if snap.placement else "FSDP2 / DTensor" if snap.unsharded is not None else ""
    if by:
        return Lever("sharding", device, f"optimizer state is already sharded ({by})", 0.0, "the rows are local shards")
    return Lever(
        "sharding",
        device,
        f"shard the optimizer state over the {world_size} ranks (ZeRO-1/2, or FSDP2 fully_shard)",
        state * (1 - 1 / world_size),
        f"the optimizer-state rows ({fmt_bytes(state)}) x (1 - 1/{world_size})",
    )


def precision(snap: Snapshot, device: str) -> Lever | None:
    """Parameters and gradients in bf16 where they are float32 now: those bytes halved."""
    fp32 = snap.parameter_fp32
    if not fp32 or not any(fp32):
        return None
    grads = sum(g * f / p for g, f, p in zip(snap.gradient, fp32, snap.parameter, strict=True) if p)
    total = sum(fp32) + grads
    return Lever(
        "precision",
        device,
        f"keep parameters and gradients in bf16 ({fmt_bytes(total)} in float32 now)",
        total / 2,
        "the float32 parameter rows and their gradients, halved",
    )


def input_lever(cap: Capacity) -> Lever:
    """The largest input that fits; it frees the predicted peak above it, from the largest input
    seen or declared (0 when that fits)."""

    def peak(elements: float) -> float:
        return cap.fit.predict(elements, elements * cap.length / cap.largest if cap.largest else 0.0)

    target = float(max(cap.largest, cap.declared or 0))
    return Lever(
        "input",
        cap.device,
        cap.describe(),
        max(peak(target) - peak(cap.elements), 0.0),
        f"the step peaks fitted against the input over {cap.fit.points} steps",
        cap.elements,
    )


def leak(
    device: str, holder: str, held_bytes: float, per_step: float, trend: tuple[float, float, float, float]
) -> Lever:
    """Fix the leak a census named (``per_step``: its growth, bytes): it frees ``held_bytes``; ``trend``:
    the device's leak (bytes per step and per second), the headroom to the limit (bytes) and the OOM ETA
    now (seconds), for how much longer the job runs once it is fixed."""
    rate_step, rate_s, headroom, eta_now = trend
    left = rate_step - per_step
    now = f"OOM ETA {fmt_duration(eta_now)} now" if math.isfinite(eta_now) else "no OOM ETA now"
    if left <= FIXED * max(rate_step, per_step):
        after = f"{now}; once fixed nothing else grows: the job runs on"
    else:
        seconds_per_step = rate_s / rate_step if rate_step > 0 and rate_s > 0 else 0.0
        eta = (headroom + held_bytes) / left * seconds_per_step
        after = f"{now}; once fixed ~{fmt_duration(eta)}" if seconds_per_step else f"{now}; the rest of the leak stays"
    return Lever(
        "leak",
        device,
        f"fix the leak held by {holder} (+{fmt_bytes(per_step)} per step; {after})",
        held_bytes,
        "the census's growing group: its bytes now and its growth per step",
    )
