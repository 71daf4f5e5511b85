"""Per-module memory tracking, on the training thread: hooks, byte counts, published snapshots.

``track(model, optimizer)`` reads the model's row plan once (``plan.Plan``) and hooks it:

- its ``forward.ForwardRecorder``: forward pre-hooks and hooks on the model's entries (the root,
  and its top-level children until the root is seen running) count nesting; a forward is recorded
  at most once a second, and then the row hooks and a ``saved_tensors_hooks`` pair count the bytes
  saved for backward per row;
- its ``gradients.GradientCounter``: an optimizer step post-hook counts ``.grad`` and
  optimizer-state bytes.

Both write through the handle's ``counts.ModelCounts``: every figure is computed on the training
thread and published as an immutable ``snapshots.Snapshot``; the collector reads only that
(DESIGN.md §2 rule 4). Nothing here raises
into training: hooks count their failures (``hook_errors()``), and ``track()`` itself raises only
for bad arguments; a model it cannot read is logged, counted and skipped. See docs/modules.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from itertools import chain, count
from types import TracebackType

from torch import nn
from torch.optim import Optimizer
from torch.utils.hooks import RemovableHandle

from memexporter.config import resolve_knob
from memexporter.tracking import snapshots
from memexporter.tracking.counts import ModelCounts
from memexporter.tracking.errors import count_failure, hook_errors
from memexporter.tracking.forward import ForwardRecorder, backend_allocated
from memexporter.tracking.gradients import GradientCounter, inner_optimizer, optimizers
from memexporter.tracking.plan import Plan, peel, unwrap
from memexporter.tracking.snapshots import ROOT_LABEL, Snapshot, active_handles

__all__ = ["ROOT_LABEL", "TrackHandle", "active_handles", "hook_errors", "inner_optimizer", "track"]

log = logging.getLogger("memexporter")

_track_lock = threading.Lock()  # track() only; scrapes never take it


class TrackHandle:
    """One tracked model. ``remove()`` (or leaving a ``with`` block) takes every hook off.

    The handle is also what the modules collector reads: ``snapshot()`` returns the last published
    ``snapshots.Snapshot`` (one attribute read, safe from any thread). It is made of three parts,
    each in its own module: ``counts`` (what is published), ``forward`` (the forward hooks) and
    ``gradients`` (the optimizer step hooks).
    """

    def __init__(
        self,
        model: nn.Module,
        plan: Plan,
        prefix: str,
        max_modules: int,
        optimizers: list[Optimizer] | None,
        cuda_forward_delta: bool = False,
        allocated: Callable[[], int] | None = None,
    ) -> None:
        """Hook ``model`` by ``plan``, with every ``module`` label starting with ``prefix``; see
        ``track()``, which checks the arguments. All or nothing: a hook that fails to register
        takes the ones before it off again, and the exception propagates."""
        self.model, self.prefix = model, prefix
        self.automatic = False  # set by auto_track: an explicit track() of the model replaces it
        self.counts = ModelCounts(plan, plan.layout(prefix), max_modules)
        if self.counts.params.failed:
            _skipped(model, self.counts.params.failed)
        if cuda_forward_delta and allocated is None:
            allocated = backend_allocated(self.counts)
            if self.counts.params.cuda_index is None:
                log.warning(
                    "memexporter: cuda_forward_delta=True, but %s has no CUDA parameters yet", type(model).__name__
                )
        self.forward = ForwardRecorder(
            self.counts,
            compiled=unwrap(model)[1],
            allocated=allocated if cuda_forward_delta else None,
            finish=self._finish_remove,
        )
        self.gradients = GradientCounter(self.counts, self.forward.end_pass)
        self._step_hooks: list[RemovableHandle] = []
        try:
            self.forward.attach(model)
            self._step_hooks = self.gradients.attach(optimizers)
        except BaseException:
            self._finish_remove()
            raise
        snapshots.register(self)

    # --- the collector's side ------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The last published byte counts (immutable)."""
        return self.counts.snapshot

    def forward_deltas(self) -> dict[str, int]:
        """``{module label: bytes}``: allocated after minus before each hooked module's forward
        (summed over calls; a parent includes its children), over the last grad-enabled forward.
        Empty unless ``track(..., cuda_forward_delta=True)``. A copy: safe to keep or change."""
        return self.forward.deltas()

    # --- lifecycle -------------------------------------------------------------------------------

    def remove(self) -> None:
        """Remove every hook and stop exporting this model's rows. Idempotent.

        Called from another thread while a forward is being recorded, it leaves the forward hooks
        to that forward's end (``ForwardRecorder.close``).
        """
        snapshots.unregister(self)
        if self.forward.close():
            self._finish_remove()

    @property
    def removed(self) -> bool:
        """``remove()`` was called, or ``track()`` could not track the model."""
        return self.forward.removed

    def _finish_remove(self) -> None:
        for h in self._step_hooks:
            h.remove()
        self._step_hooks.clear()
        self.forward.detach()

    def __enter__(self) -> TrackHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


def _skipped(model: nn.Module, failed: int) -> None:
    """Log once (and count) tensors of ``model`` that could not be read: they are left out."""
    try:
        raise RuntimeError(f"{failed} parameter or buffer tensor(s) of {type(model).__name__} could not be read")
    except RuntimeError:
        count_failure("track() (those tensors are left out of the rows)")


def track(
    model: nn.Module,
    optimizer: object = None,
    *,
    depth: int | None = None,
    max_modules: int | None = None,
    prefix: str | None = None,
    cuda_forward_delta: bool = False,
    allocated: Callable[[], int] | None = None,
) -> TrackHandle:
    """Export per-module parameter, gradient, optimizer-state and activation bytes of ``model``.

    ``optimizer``: the optimizer(s) whose state to attribute (framework wrappers are unwrapped);
    ``None`` watches every optimizer step (global hook) and keeps the optimizers that hold this
    model's parameters. ``depth`` and ``max_modules`` default to the ``module_depth`` /
    ``max_modules`` knobs (``MEMEXPORTER_*``). ``prefix`` starts every ``module`` label of this
    model; by default the first free of ``""``, the class name, ``model1``, ``model2``... so two
    tracked models never share a row. ``cuda_forward_delta``: also record allocated bytes around
    each hooked module's forward (``TrackHandle.forward_deltas()``), read with ``allocated()`` if
    given, else from the backend.

    Raises ``TypeError``/``ValueError`` for bad arguments only. A model that cannot be read or
    hooked is logged once and counted in ``hook_errors()``; the handle returned then tracks nothing.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"memexporter: track() needs an nn.Module, got {model!r}")
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"memexporter: prefix must be a string, got {prefix!r}")
    depth = resolve_knob("module_depth", depth)
    max_modules = resolve_knob("max_modules", max_modules)
    opts = optimizers(optimizer)
    inner, outer = peel(model)
    for h in active_handles():
        if isinstance(h, TrackHandle) and unwrap(h.model)[0] is inner:
            if h.automatic:  # found by auto_track: the script's own track() takes over
                h.remove()
                continue
            raise ValueError(f"memexporter: model {type(model).__name__} is already tracked; remove() its handle first")
    try:
        plan = Plan(inner, depth, outer)
    except Exception:
        count_failure("track() (reading the module tree; this model is not tracked)")
        return _untracked(model, depth, max_modules)
    with _track_lock:  # two threads tracking at once must not pick the same prefix
        taken = {name for h in active_handles() for name in h.snapshot().layout.names}
        if prefix is not None:
            if taken & set(plan.layout(prefix).names):
                raise ValueError(f"memexporter: prefix {prefix!r} makes module labels collide with a tracked model's")
        else:
            candidates = chain(["", type(inner).__name__], (f"model{i}" for i in count(1)))
            prefix = next(p for p in candidates if not taken & set(plan.layout(p).names))
        try:
            return TrackHandle(model, plan, prefix, max_modules, opts, cuda_forward_delta, allocated)
        except Exception:  # the handle took its own hooks off again
            count_failure("track() (hooking the model; this model is not tracked)")
            return _untracked(model, depth, max_modules)


def _untracked(model: nn.Module, depth: int, max_modules: int) -> TrackHandle:
    """A removed handle over an empty plan: what ``track()`` returns when it could not track
    ``model``, so that the caller's ``remove()`` and ``with`` still work."""
    handle = TrackHandle(nn.Module(), Plan(nn.Module(), depth), "", max_modules, [])
    handle.remove()
    handle.model = model
    return handle
