"""One tracked model's DeepSpeed ZeRO rows: gradients and optimizer state over the flat partitions.

A ``GradientCounter`` (``gradients.py``) hands every optimizer step of this model to a
``ZeroRows`` first. Under ZeRO 1, 2 and 3 DeepSpeed's torch optimizer steps one flat partition per
parameter group (``storage/zero.py``), so the step hook sees one partition at a time, while its
gradient is there: each partition is counted in its own hook (the first, then at most once per
``STEP_COUNT_INTERVAL_S``), kept, and the sum over the partitions is published. The fragment map is
read at the first step and again when DeepSpeed rebuilt its partitions. All on the training thread,
in the step hook; nothing here raises: where DeepSpeed's structures differ, the rows are left out
with the reason (``Snapshot.absent``), logged once.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch
from torch.optim import Optimizer

from memexporter.tracking.counts import ModelCounts, Placement
from memexporter.tracking.storage import deepspeed, zero
from memexporter.tracking.storage.zero import FlatCount, ZeroMap

__all__ = ["ZeroRows"]

FAMILIES = ("gradient", "optimizer_state")
_MAX_FLATS = 1024  # partitions whose last count time is kept (one per parameter group or ZeRO-3 sub-group)


class ZeroRows:
    """The ZeRO partitions of one tracked model, and their counts between step hooks."""

    def __init__(self, counts: ModelCounts, interval: float) -> None:
        """``interval``: seconds between two counts of one partition (``STEP_COUNT_INTERVAL_S``)."""
        self._counts, self.interval = counts, interval
        self._map: ZeroMap | None = None
        self._tried: tuple[int, ...] | None = None  # the fingerprint a map was last read for
        self._flats: dict[int, FlatCount] = {}
        self._counted: dict[int, float] = {}  # id(flat) -> monotonic s
        self._ours: weakref.WeakKeyDictionary[Optimizer, bool] = weakref.WeakKeyDictionary()

    def steps(self, optimizer: Optimizer) -> bool:
        """Whether ``optimizer`` steps this model's ZeRO partitions (decided at its first step)."""
        ours = self._ours.get(optimizer)
        if ours is None:
            flats = _stepped(optimizer)
            known = any(id(f) in self._shares() for f in flats)  # a second optimizer over the same map
            found = deepspeed.loaded() and (known or self._read())
            # Unreadable (rows absent) or one of the model's partitions: either way DeepSpeed's step.
            ours = found and (self._map is None or any(id(f) in self._shares() for f in flats))
            self._ours[optimizer] = ours
        return ours

    def on_step(self, optimizer: Optimizer) -> None:
        """Count the partitions ``optimizer`` is stepping now and publish the sum over all of them."""
        now = time.monotonic()
        due = [f for f in _stepped(optimizer) if now - self._counted.get(id(f), -1e18) >= self.interval]
        if not due:
            return
        for f in due:  # also when unreadable: a failed read is not retried before the interval
            self._counted[id(f)] = now
        params = [p for p, _ in self._counts.plan.tensors(self._counts.plan.params)]
        if any(id(f) not in self._shares() for f in due) or zero.fingerprint(params) != self._tried:
            self._read()
            self._counts.refresh_params(force=True)  # ZeRO-3: the partitions may have moved too
        if self._map is None:
            return
        for flat in due:
            share = self._map.shares.get(id(flat))
            if share is not None and share.flat() is flat:
                state = optimizer.state.get(flat, {})  # a defaultdict: get() does not insert
                self._flats[id(flat)] = zero.count(share, flat, state)
        self._publish()

    def _shares(self) -> dict[int, Any]:
        return self._map.shares if self._map is not None else {}

    def _read(self) -> bool:
        """(Re)read the fragment map; False when the model has none. On ``Unsupported`` the rows
        are published as absent, with the reason logged once, and the map stays None."""
        plan = self._counts.plan
        params = plan.tensors(plan.params)
        self._tried = zero.fingerprint([p for p, _ in params])
        self._flats.clear()
        if len(self._counted) > _MAX_FLATS:  # bounded: rebuilt partitions are new tensors
            self._counted.clear()
        try:
            deepspeed.checked()
            self._map = zero.build(params)
        except deepspeed.Unsupported as exc:
            self._map = None
            reason = deepspeed.absent(str(exc))
            zeros = (0,) * len(plan.paths)
            self._counts.publish_step(zeros, zeros, absent=tuple((f, reason) for f in FAMILIES))
            return True  # DeepSpeed's, but unreadable: its steps are ours to leave out
        return self._map is not None

    def _publish(self) -> None:
        n = len(self._counts.plan.paths)
        grads, state = [0] * n, [0] * n
        where: dict[tuple[str, str], list[int]] = {}
        for key, c in self._flats.items():
            if key not in self._shares():
                continue
            for family, out, pairs, device in (
                ("gradient", grads, c.gradient, c.gradient_device),
                ("optimizer_state", state, c.optimizer_state, c.state_device),
            ):
                per_device = where.setdefault((family, device), [0] * n)
                for row, nbytes in pairs:
                    out[row] += nbytes
                    per_device[row] += nbytes
        placement: Placement = tuple((f, d, tuple(v)) for (f, d), v in sorted(where.items()))
        self._counts.publish_step(tuple(grads), tuple(state), placement)


def _stepped(optimizer: Optimizer) -> list[torch.Tensor]:
    """The tensors ``optimizer`` steps now: DeepSpeed swaps one partition's group in for each step."""
    return [p for g in optimizer.param_groups for p in g["params"]]
