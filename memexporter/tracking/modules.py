"""Per-module memory tracking, on the training thread: hooks, byte counts, published snapshots.

``track(model, optimizer)`` walks the module tree once and hooks it:

- a forward pre-hook / forward hook pair on the root and on every module at most ``depth`` levels
  down keeps a stack of running rows, so a saved tensor goes to the innermost running module;
- for each grad-enabled forward of the root, a ``saved_tensors_hooks`` pair entered in the root's
  pre-hook and left in its post-hook counts the storage bytes saved for backward (each storage
  once; parameters and buffers excluded). It chains to the pair that was active before the
  forward (``save_on_cpu``, the user's own), because torch applies only the innermost pair;
- an optimizer step post-hook counts ``.grad`` and optimizer-state bytes.

Every figure is computed here and published as an immutable ``snapshots.Snapshot``; the collector
reads only that (DESIGN.md §2 rule 4). Hooks never raise: failures are counted by
``hook_errors()`` and the first one is logged. See docs/modules.md.

This module holds ``track()`` and the handle; the hook methods the handle registers live in
``hooks.py`` (forward, saved tensors) and ``optimizer.py`` (optimizer steps).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from itertools import chain, count
from types import MappingProxyType, TracebackType

from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from memexporter.config import resolve_knob
from memexporter.tracking import ledger, snapshots
from memexporter.tracking.hooks import ForwardHooks, _eager, _top_hooks, hook_errors
from memexporter.tracking.ledger import Plan, unwrap

# Re-exported for callers of the public module; the hooks read them in tracking/optimizer.py.
from memexporter.tracking.optimizer import STEP_COUNT_INTERVAL_S as STEP_COUNT_INTERVAL_S  # noqa: PLC0414
from memexporter.tracking.optimizer import StepHooks
from memexporter.tracking.snapshots import ROOT_LABEL, Snapshot, active_handles

__all__ = ["ROOT_LABEL", "TrackHandle", "active_handles", "hook_errors", "track"]

log = logging.getLogger("memexporter")

_track_lock = threading.Lock()  # track() only; scrapes never take it


class TrackHandle(ForwardHooks, StepHooks):
    """One tracked model. ``remove()`` (or leaving a ``with`` block) takes every hook off.

    The handle is also what the modules collector reads: ``snapshot()`` returns the last published
    ``snapshots.Snapshot`` (one attribute read, safe from any thread).
    """

    def __init__(self, model: nn.Module, plan: Plan, prefix: str, max_modules: int,
                 optimizers: list[Optimizer] | None, cuda_forward_delta: bool = False,
                 allocated: Callable[[], int] | None = None) -> None:
        self.model, self.prefix = model, prefix
        compiled = unwrap(model)[1]
        self._plan, self._pid = plan, os.getpid()
        layout = plan.layout(prefix)
        zeros = (0,) * len(layout.names)
        self._params, self._fingerprint = ledger.count_params(plan), plan.fingerprint()
        self._snap = Snapshot(layout, max_modules, self._params.bytes, zeros, zeros, zeros)
        self._write = threading.Lock()  # writers only (training threads); scrapes never take it
        self._stack: list[int] = []  # rows of the modules running now, innermost last
        self._depth = 0  # nesting of root forwards
        self._ctx: saved_tensors_hooks | None = None  # our pair, while a recorded forward runs
        self._acc: list[int] = []
        self._opt_state: weakref.WeakKeyDictionary[Optimizer, tuple[int, ...]] = weakref.WeakKeyDictionary()
        self._counted: weakref.WeakKeyDictionary[Optimizer, float] = weakref.WeakKeyDictionary()
        self._holds: weakref.WeakKeyDictionary[Optimizer, tuple[int, bool]] = weakref.WeakKeyDictionary()
        self._allocated = (allocated or self._backend_allocated()) if cuda_forward_delta else None
        self._dacc: list[int] | None = None  # forward deltas of the recorded forward
        self._before: list[int] = []
        self._deltas: Mapping[str, int] = MappingProxyType({})
        self._removed = False
        self._sample = _sampler()
        if cuda_forward_delta and allocated is None and self._params.cuda_index is None:
            log.warning("memexporter: cuda_forward_delta=True, but %s has no CUDA parameters yet", type(model).__name__)
        # The root hooks always run eagerly, also under model.compile(): they push saved-tensor hooks.
        hooks: list[RemovableHandle] = [
            model.register_forward_pre_hook(_eager(self._root_pre), prepend=True),
            model.register_forward_hook(_eager(self._root_post), always_call=True),
        ]
        # Under torch.compile(model) Dynamo traces the inner modules: hooks there would run at
        # trace time, not interleaved with the saves, so activations go to the root row instead.
        for m, row in [] if compiled else plan.hooked:
            pre, post = self._sub_hooks(row)
            hooks.append(m.register_forward_pre_hook(pre))
            hooks.append(m.register_forward_hook(post, always_call=True))
        if optimizers is None:
            hooks.append(register_optimizer_step_post_hook(self._on_any_step))
        else:
            hooks.extend(o.register_step_post_hook(self._on_step) for o in optimizers)
        self._hooks = hooks
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

        Called from another thread while a forward is being recorded, it leaves the two root
        hooks: the forward's end pops our saved-tensor hooks (only that thread can), and the next
        forward removes them.
        """
        self._removed = True
        snapshots.unregister(self)
        ctx = self._ctx
        top = _top_hooks(True)
        if ctx is not None and top is not None and top[0] is ctx.pack_hook:  # mid-forward, this thread
            self._ctx = None
            ctx.__exit__(None, None, None)
        keep = self._hooks[:2] if self._ctx is not None else []
        for h in self._hooks[len(keep):]:
            h.remove()
        self._hooks = keep

    def __enter__(self) -> TrackHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()

    def _backend_allocated(self) -> Callable[[], int]:
        # backends/torch is the only module that touches torch.cuda (DESIGN.md §1).
        from memexporter.backends.torch import TorchBackend

        backend = TorchBackend()

        def allocated() -> int:
            index = self._params.cuda_index
            return 0 if index is None else backend.allocated(index)[0]
        return allocated


def _noop() -> None:
    return None


def _sampler() -> Callable[[], None]:
    """``memexporter.tracking.steps.sample`` (a step-peak sample at the end of each forward)."""
    try:
        from memexporter.tracking import steps

        return steps.sample
    except (ImportError, AttributeError):
        return _noop


def _optimizers(optimizer: Optimizer | Iterable[Optimizer] | None) -> list[Optimizer] | None:
    if optimizer is None:
        return None
    bad = f"memexporter: optimizer must be a torch.optim.Optimizer or a list of them, got {optimizer!r}"
    try:
        opts = [optimizer] if isinstance(optimizer, Optimizer) else list(optimizer)
    except TypeError:
        raise TypeError(bad) from None
    if not all(isinstance(o, Optimizer) for o in opts):
        raise TypeError(bad)
    return opts


def track(model: nn.Module, optimizer: Optimizer | Iterable[Optimizer] | None = None, *,
          depth: int | None = None, max_modules: int | None = None, prefix: str | None = None,
          cuda_forward_delta: bool = False, allocated: Callable[[], int] | None = None) -> TrackHandle:
    """Export per-module parameter, gradient, optimizer-state and activation bytes of ``model``.

    ``optimizer``: the optimizer(s) whose state to attribute; ``None`` watches every optimizer
    step (global hook) and keeps the optimizers that hold this model's parameters. ``depth`` and
    ``max_modules`` default to the ``module_depth`` / ``max_modules`` knobs (``MEMEXPORTER_*``).
    ``prefix`` starts every ``module`` label of this model; by default the first free of ``""``,
    the class name, ``model1``, ``model2``... so two tracked models never share a row.
    ``cuda_forward_delta``: also record allocated bytes around each hooked module's forward
    (``TrackHandle.forward_deltas()``), read with ``allocated()`` if given, else from the backend.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"memexporter: track() needs an nn.Module, got {model!r}")
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"memexporter: prefix must be a string, got {prefix!r}")
    depth = resolve_knob("module_depth", depth)
    max_modules = resolve_knob("max_modules", max_modules)
    opts = _optimizers(optimizer)
    inner = unwrap(model)[0]
    for h in active_handles():
        if isinstance(h, TrackHandle) and unwrap(h.model)[0] is inner:
            raise ValueError(f"memexporter: model {type(model).__name__} is already tracked; remove() its handle first")
    plan = Plan(inner, depth)
    with _track_lock:  # two threads tracking at once must not pick the same prefix
        taken = {name for h in active_handles() for name in h.snapshot().layout.names}
        if prefix is not None:
            if taken & set(plan.layout(prefix).names):
                raise ValueError(f"memexporter: prefix {prefix!r} makes module labels collide with a tracked model's")
        else:
            candidates = chain(["", type(inner).__name__], (f"model{i}" for i in count(1)))
            prefix = next(p for p in candidates if not taken & set(plan.layout(p).names))
        return TrackHandle(model, plan, prefix, max_modules, opts, cuda_forward_delta, allocated)


