"""Gradient and optimizer-state bytes of a tracked model, counted at its optimizer steps.

A ``GradientCounter`` is one part of a ``TrackHandle`` (``modules.py``): it owns the optimizer
step post-hooks (one per given optimizer, or the global one that keeps the optimizers holding this
model's parameters) and publishes through the handle's ``counts.ModelCounts``. A step recounts
``.grad`` and optimizer-state bytes (``ledger.count_step``) and, like each recorded forward,
parameter bytes if a storage moved. Also here: the unwrapping of framework optimizers
(``inner_optimizer``). Failures go to ``hook_errors()``.

"Step" here is always an optimizer step; the training-step peaks are ``steps.py``'s.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from memexporter.tracking import ledger
from memexporter.tracking.counts import ModelCounts
from memexporter.tracking.errors import count_failure
from memexporter.tracking.partitions import ZeroRows

__all__ = ["STEP_COUNT_INTERVAL_S", "GradientCounter", "inner_optimizer", "optimizers"]

STEP_COUNT_INTERVAL_S = 1.0
"""Gradient and optimizer-state bytes are recounted at an optimizer step at most this often."""


class GradientCounter:
    """The optimizer step post-hooks of one tracked model, and the per-optimizer counts they keep."""

    def __init__(self, counts: ModelCounts, end_pass: Callable[[], None]) -> None:
        """``end_pass``: the forward recorder's, called at each step over the model."""
        self._counts, self._end_pass = counts, end_pass
        self._state: weakref.WeakKeyDictionary[Optimizer, tuple[int, ...]] = weakref.WeakKeyDictionary()
        self._counted: weakref.WeakKeyDictionary[Optimizer, float] = weakref.WeakKeyDictionary()  # monotonic s
        self._holds: weakref.WeakKeyDictionary[Optimizer, tuple[int, bool]] = weakref.WeakKeyDictionary()
        self.zero = ZeroRows(counts, STEP_COUNT_INTERVAL_S)  # DeepSpeed ZeRO's flat partitions

    def attach(self, optimizers: list[Optimizer] | None) -> list[RemovableHandle]:
        """Hook ``optimizers``' steps, or every optimizer's (the global hook) when ``None``."""
        if optimizers is None:
            return [register_optimizer_step_post_hook(self._on_any_step)]
        return [o.register_step_post_hook(self._on_step) for o in optimizers]

    def _on_any_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        # The global hook sees every optimizer: keep those that hold this model's parameters.
        try:
            groups = len(optimizer.param_groups)
            known = self._holds.get(optimizer)
            if known is None or known[0] != groups:
                ids = self._counts.params.param_ids
                held = any(id(p) in ids for g in optimizer.param_groups for p in g["params"])
                known = (groups, held or self.zero.steps(optimizer))
                self._holds[optimizer] = known
        except Exception:
            count_failure("optimizer step hook")
            return
        if known[1]:
            self._on_step(optimizer, args, kwargs)

    def _on_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        try:
            if os.getpid() != self._counts.pid:
                return
            self._end_pass()  # the pass is over (and a forward interrupted by Ctrl-C is closed)
            if self.zero.steps(optimizer):  # DeepSpeed ZeRO: flat partitions, one group per step call
                self.zero.interval = STEP_COUNT_INTERVAL_S
                self.zero.on_step(optimizer)
                return
            # Counting touches every .grad and state tensor (~2 us per parameter): do it at the
            # first step of each optimizer, then at most every STEP_COUNT_INTERVAL_S seconds.
            now = time.monotonic()
            if now - self._counted.get(optimizer, -1e18) < STEP_COUNT_INTERVAL_S:
                return
            self._counted[optimizer] = now
            self._counts.refresh_params()
            grads, state = ledger.count_step(self._counts.plan, optimizer)
            self._state[optimizer] = state  # several optimizers on one model add up
            total = tuple(sum(col) for col in zip(*self._state.values(), strict=True))
            self._counts.publish_step(grads, total)
        except Exception:
            count_failure("optimizer step hook")


def inner_optimizer(optimizer: object) -> Optimizer | None:
    """The torch optimizer under framework wrappers (accelerate's ``AcceleratedOptimizer``,
    Lightning's ``LightningOptimizer``, any object with an inner ``.optimizer``), or None.

    A wrapper that subclasses ``Optimizer`` without its set-up (accelerate's) has none of its
    hooks: the inner one is the optimizer that steps, once per step taken through the wrapper.
    """
    for _ in range(8):  # wrappers of wrappers, but never a cycle
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer:
            return optimizer if isinstance(optimizer, Optimizer) else None
        optimizer = inner
    return None


def optimizers(optimizer: object) -> list[Optimizer] | None:
    """``track()``'s ``optimizer`` argument as torch optimizers (``None`` stays ``None``); a
    ``TypeError`` names anything else."""
    if optimizer is None:
        return None
    bad = (
        "memexporter: optimizer must be a torch.optim.Optimizer (or a framework wrapper of one, "
        f"with an inner .optimizer) or a list of them, got {optimizer!r}"
    )
    single = inner_optimizer(optimizer)
    if single is not None:
        return [single]
    try:
        opts = [inner_optimizer(o) for o in optimizer]  # type: ignore[attr-defined]
    except TypeError:
        raise TypeError(bad) from None
    if not all(o is not None for o in opts):
        raise TypeError(bad)
    return [o for o in opts if o is not None]
