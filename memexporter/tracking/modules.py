"""Per-module memory tracking, on the training thread: hooks, byte counts, published snapshots.

``track(model, optimizer)`` reads the model's row plan once (``plan.Plan``) and hooks it:

- forward pre-hooks and hooks on the model's entries (the root, and its top-level children until
  the root is seen running) count nesting; a forward is recorded at most once a second, and then
  the row hooks and a ``saved_tensors_hooks`` pair count the bytes saved for backward per row
  (``hooks.py``);
- an optimizer step post-hook counts ``.grad`` and optimizer-state bytes (``optimizer.py``).

Every figure is computed on the training thread and published as an immutable
``snapshots.Snapshot``; the collector reads only that (DESIGN.md §2 rule 4). Nothing here raises
into training: hooks count their failures (``hook_errors()``), and ``track()`` itself raises only
for bad arguments; a model it cannot read is logged, counted and skipped. See docs/modules.md.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from itertools import chain, count
from types import MappingProxyType, TracebackType

from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from memexporter.config import resolve_knob
from memexporter.tracking import ledger, phases, saved, snapshots
from memexporter.tracking.errors import count_failure, hook_errors
from memexporter.tracking.hooks import ForwardHooks

# Re-exported for callers of the public module; the hooks read them in tracking/optimizer.py.
from memexporter.tracking.optimizer import STEP_COUNT_INTERVAL_S as STEP_COUNT_INTERVAL_S  # noqa: PLC0414
from memexporter.tracking.optimizer import StepHooks, inner_optimizer, optimizers
from memexporter.tracking.plan import Plan, peel, unwrap
from memexporter.tracking.schedule import Schedule
from memexporter.tracking.snapshots import ROOT_LABEL, Snapshot, active_handles

__all__ = ["ROOT_LABEL", "TrackHandle", "active_handles", "hook_errors", "inner_optimizer", "track"]

log = logging.getLogger("memexporter")

_track_lock = threading.Lock()  # track() only; scrapes never take it


class TrackHandle(ForwardHooks, StepHooks):
    """One tracked model. ``remove()`` (or leaving a ``with`` block) takes every hook off.

    The handle is also what the modules collector reads: ``snapshot()`` returns the last published
    ``snapshots.Snapshot`` (one attribute read, safe from any thread).
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
        self.model, self.prefix = model, prefix
        self.automatic = False  # set by auto_track: an explicit track() of the model replaces it
        compiled = unwrap(model)[1]
        self._plan, self._pid = plan, os.getpid()
        layout = plan.layout(prefix)
        zeros = (0,) * len(layout.names)
        self._params, self._fingerprint = ledger.count_params(plan), plan.fingerprint()
        if self._params.failed:
            _skipped(model, self._params.failed)
        self._snap = Snapshot(layout, max_modules, self._params.bytes, zeros, zeros, zeros, self._params.unsharded)
        self._write = threading.Lock()  # writers only (training threads); scrapes never take it
        self._stack: list[int] = []  # rows of the modules running now, innermost last (recorded forwards)
        self._depth = 0  # nesting of entry forwards
        self._ctx: saved_tensors_hooks | None = None  # our pair, while a recorded forward runs
        self._acc: list[int] = []
        self._seen: set[int] = set()
        self._schedule = Schedule()
        self._life = threading.Lock()
        self._entry = 0
        self._root_seen = compiled  # a compiled root: its children are traced, never entries
        self._rows_on: list[tuple[nn.Module, int]] = []
        self._row_fns: list[tuple[nn.Module, Callable[..., None], Callable[..., None]]] | None = None
        self._opt_state: weakref.WeakKeyDictionary[Optimizer, tuple[int, ...]] = weakref.WeakKeyDictionary()
        self._counted: weakref.WeakKeyDictionary[Optimizer, float] = weakref.WeakKeyDictionary()
        self._holds: weakref.WeakKeyDictionary[Optimizer, tuple[int, bool]] = weakref.WeakKeyDictionary()
        self._allocated = (allocated or self._backend_allocated()) if cuda_forward_delta else None
        self._dacc: list[int] | None = None  # forward deltas of the recorded forward
        self._before: list[int] = []
        self._deltas: Mapping[str, int] = MappingProxyType({})
        self._removed = False
        self._forward_begin, self._forward_end = phases.forward_begin, phases.forward_end
        if cuda_forward_delta and allocated is None and self._params.cuda_index is None:
            log.warning("memexporter: cuda_forward_delta=True, but %s has no CUDA parameters yet", type(model).__name__)
        # All or nothing: a hook that fails to register takes the ones before it off again.
        self._hooks: list[RemovableHandle] = []
        self._entry_hooks: list[RemovableHandle] = []
        try:
            # The root's hooks come first and run eagerly, also under model.compile().
            pre, post = self._entry_hooks_for(0)
            self._hooks.append(model.register_forward_pre_hook(pre, prepend=True))
            self._hooks.append(model.register_forward_hook(post, always_call=True))
            # Under torch.compile(model) Dynamo traces the inner modules: hooks there would run at
            # trace time, not interleaved with the saves, so activations go to the root row instead.
            for m, row in [] if compiled else plan.entries:
                pre, post = self._entry_hooks_for(row)
                self._entry_hooks.append(m.register_forward_pre_hook(pre))
                self._entry_hooks.append(m.register_forward_hook(post, always_call=True))
            if optimizers is None:
                self._hooks.append(register_optimizer_step_post_hook(self._on_any_step))
            else:
                self._hooks.extend(o.register_step_post_hook(self._on_step) for o in optimizers)
        except BaseException:
            self._finish_remove()
            raise
        snapshots.register(self)

    # --- the collector's side ------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The last published byte counts (immutable)."""
        return self._snap

    def forward_deltas(self) -> dict[str, int]:
        """``{module label: bytes}``: allocated after minus before each hooked module's forward
        (summed over calls; a parent includes its children), over the last grad-enabled forward.
        Empty unless ``track(..., cuda_forward_delta=True)``. A copy: safe to keep or change."""
        return dict(self._deltas)

    # --- lifecycle -------------------------------------------------------------------------------

    def remove(self) -> None:
        """Remove every hook and stop exporting this model's rows. Idempotent.

        Called from another thread while a forward is being recorded, it leaves the hooks to
        that forward's end: only that thread can pop our saved-tensor hooks, and removing a
        module's hooks while it runs would change the dicts torch is iterating.
        """
        with self._life:  # not between another thread's decision to record and its _begin()
            self._removed = True
            snapshots.unregister(self)
            ctx = self._ctx
            if ctx is not None:
                if not saved.on_top(ctx):
                    return  # recording on another thread: it pops its pair, its next forward the hooks
                self._ctx = None  # mid-forward, on this thread
                ctx.__exit__(None, None, None)
        self._finish_remove()

    def _finish_remove(self) -> None:
        for handles in (self._hooks, self._entry_hooks):
            self._detach(handles)
        self._detach_rows()

    def __enter__(self) -> TrackHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def _backend_allocated(self) -> Callable[[], int]:
        # backends/torch is the only module that touches torch.cuda (DESIGN.md §1).
        from memexporter.backends.cuda import TorchBackend

        backend = TorchBackend()

        def allocated() -> int:
            index = self._params.cuda_index
            return 0 if index is None else backend.allocated(index)[0]

        return allocated


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
