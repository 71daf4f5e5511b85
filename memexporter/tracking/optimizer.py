"""Optimizer-step hooks of a tracked model, on the training thread: gradient and state bytes.

``StepHooks`` holds the step post-hook methods ``TrackHandle`` (tracking/modules.py) registers:
one per given optimizer, or the global one that keeps the optimizers holding this model's
parameters, and the unwrapping of framework optimizers (``inner_optimizer``). A step recounts ``.grad`` and optimizer-state bytes (``ledger.count_step``) and, like
each recorded forward, parameter bytes if a storage moved. Failures go to ``hook_errors()``.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch.optim import Optimizer

from memexporter.tracking import ledger
from memexporter.tracking.errors import count_failure
from memexporter.tracking.ledger import ParamCount
from memexporter.tracking.plan import Plan
from memexporter.tracking.snapshots import Snapshot

STEP_COUNT_INTERVAL_S = 1.0
"""Gradient and optimizer-state bytes are recounted at an optimizer step at most this often."""


class StepHooks:
    """The optimizer step post-hooks of a ``TrackHandle``, and the parameter recount they share."""

    # Set up by TrackHandle.__init__ (only annotated here, for the type checker).
    _plan: Plan
    _pid: int
    _params: ParamCount
    _fingerprint: tuple[tuple[int, int], ...]
    _snap: Snapshot
    _write: threading.Lock
    _opt_state: weakref.WeakKeyDictionary[Optimizer, tuple[int, ...]]
    _counted: weakref.WeakKeyDictionary[Optimizer, float]
    _holds: weakref.WeakKeyDictionary[Optimizer, tuple[int, bool]]
    _heal: Callable[[], None]  # ForwardHooks

    def _refresh_params(self) -> None:
        """Recount parameter bytes if any parameter or buffer moved (``.to()``, ``.half()``) or was
        replaced (``fully_shard`` after ``track()``)."""
        fp = self._plan.fingerprint()
        if fp != self._fingerprint:
            self._params = ledger.count_params(self._plan)
            self._fingerprint = fp
            with self._write:
                self._snap = replace(self._snap, parameter=self._params.bytes, unsharded=self._params.unsharded)

    def _on_any_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        # The global hook sees every optimizer: keep those that hold this model's parameters.
        try:
            groups = len(optimizer.param_groups)
            known = self._holds.get(optimizer)
            if known is None or known[0] != groups:
                ids = self._params.param_ids
                known = (groups, any(id(p) in ids for g in optimizer.param_groups for p in g["params"]))
                self._holds[optimizer] = known
        except Exception:
            count_failure("optimizer step hook")
            return
        if known[1]:
            self._on_step(optimizer, args, kwargs)

    def _on_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        try:
            if os.getpid() != self._pid:
                return
            self._heal()  # the pass is over (and a forward interrupted by Ctrl-C is closed)
            # Counting touches every .grad and state tensor (~2 us per parameter): do it at the
            # first step of each optimizer, then at most every STEP_COUNT_INTERVAL_S seconds.
            now = time.monotonic()
            if now - self._counted.get(optimizer, -1e18) < STEP_COUNT_INTERVAL_S:
                return
            self._counted[optimizer] = now
            self._refresh_params()
            grads, state = ledger.count_step(self._plan, optimizer)
            self._opt_state[optimizer] = state  # several optimizers on one model add up
            total = tuple(sum(col) for col in zip(*self._opt_state.values(), strict=True))
            with self._write:
                self._snap = replace(self._snap, gradient=grads, optimizer_state=total)
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
