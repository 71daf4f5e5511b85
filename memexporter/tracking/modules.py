"""Per-module memory tracking, on the training thread: hooks, byte counts, published snapshots.

``track(model, optimizer)`` walks the module tree once and hooks it:

- a forward pre-hook / forward hook pair on the root and on every module at most ``depth`` levels
  down keeps a stack of running rows, so a saved tensor goes to the innermost running module;
- for each grad-enabled forward of the root, a ``saved_tensors_hooks`` pair entered in the root's
  pre-hook and left in its post-hook counts the storage bytes saved for backward (each storage
  once; parameters and buffers excluded). It chains to the pair that was active before the
  forward (``save_on_cpu``, the user's own), because torch applies only the innermost pair;
- an optimizer step post-hook counts ``.grad`` and optimizer-state bytes.

Every figure is computed here and published as an immutable ``ledger.Snapshot``; the collector
reads only that (DESIGN.md §2 rule 4). Hooks never raise: failures are counted by
``hook_errors()`` and the first one is logged. See docs/modules.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from itertools import chain, count
from types import MappingProxyType, TracebackType
from typing import Any, cast

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from memexporter.config import resolve_knob
from memexporter.tracking import ledger
from memexporter.tracking.ledger import ROOT_LABEL, Plan, Snapshot, active_handles, storage, unwrap

__all__ = ["ROOT_LABEL", "TrackHandle", "active_handles", "hook_errors", "track"]

log = logging.getLogger("memexporter")

_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_push_hooks = torch._C._autograd._push_saved_tensors_default_hooks
_pop_hooks = torch._C._autograd._pop_saved_tensors_default_hooks
_hooks_enabled = torch._C._autograd._saved_tensors_hooks_is_enabled  # type: ignore[attr-defined]
_graph_task = torch._C._current_graph_task_id  # -1 outside backward
# Run a hook eagerly even inside a compiled region (a graph break; 0.6 us per call in eager).
_eager = cast(Callable[[Callable[..., None]], Callable[..., None]], torch.compiler.disable)

STEP_COUNT_INTERVAL_S = 1.0
"""Gradient and optimizer-state bytes are recounted at an optimizer step at most this often."""

_errors = 0
_errors_lock = threading.Lock()
_track_lock = threading.Lock()  # track() only; scrapes never take it


def hook_errors() -> int:
    """Failures caught inside tracking hooks since the process started (never raised to training)."""
    return _errors


def _fail(where: str) -> None:
    # Called from an except block. Count every failure, log the first traceback only: a broken
    # hook runs on every forward and would flood the training log.
    global _errors
    with _errors_lock:
        _errors += 1
        first = _errors == 1
    if first:
        log.exception("memexporter: module tracking failed in the %s; training goes on, further "
                      "failures are only counted (memexporter.tracking.modules.hook_errors())", where)


def _record_slow(t: torch.Tensor, seen: set[int], acc: list[int], stack: list[int]) -> None:
    try:
        key, nbytes = storage(t)
        if key not in seen:
            seen.add(key)
            acc[stack[-1]] += nbytes
    except Exception:
        _fail("saved-tensor pack hook")


def _identity(x: Any) -> Any:
    return x


class TrackHandle:
    """One tracked model. ``remove()`` (or leaving a ``with`` block) takes every hook off.

    The handle is also what the modules collector reads: ``snapshot()`` returns the last published
    ``ledger.Snapshot`` (one attribute read, safe from any thread).
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
        ledger.register(self)

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
        ledger.unregister(self)
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

    # --- forward hooks -------------------------------------------------------------------------

    def _sub_hooks(self, row: int) -> tuple[Callable[..., None], Callable[..., None]]:
        stack, before, allocated = self._stack, self._before, self._allocated
        if allocated is None:
            def pre(m: nn.Module, args: Any) -> None:
                stack.append(row)

            def post(m: nn.Module, args: Any, out: Any) -> None:
                if stack:
                    stack.pop()
            return pre, post

        def dpre(m: nn.Module, args: Any) -> None:
            stack.append(row)
            try:
                if self._dacc is not None:
                    before.append(allocated())
            except Exception:
                _fail("forward pre-hook (cuda_forward_delta)")

        def dpost(m: nn.Module, args: Any, out: Any) -> None:
            if stack:
                stack.pop()
            try:
                if self._dacc is not None and before:
                    self._dacc[row] += allocated() - before.pop()
            except Exception:
                _fail("forward hook (cuda_forward_delta)")
        return dpre, dpost

    def _root_pre(self, module: nn.Module, args: Any) -> None:
        if self._removed:  # removed while the last forward ran on another thread: finish now
            self.remove()
            return
        self._stack.append(0)
        self._depth += 1
        try:
            # Only the outermost, grad-enabled forward on the owning process records. A checkpoint
            # recompute runs inside backward (a graph task is running): it is not a new forward.
            if (self._depth == 1 and torch.is_grad_enabled() and _graph_task() == -1
                    and os.getpid() == self._pid and _hooks_enabled()):
                self._begin()
        except Exception:
            _fail("root forward pre-hook")

    def _root_post(self, module: nn.Module, args: Any, out: Any) -> None:
        try:
            self._depth = max(0, self._depth - 1)
            if self._depth:
                if self._stack:
                    self._stack.pop()
                return
            self._stack.clear()  # also heals a stack left unbalanced by a failed hook
            if self._ctx is not None:
                self._end()
            self._sample()
        except Exception:
            _fail("root forward hook")

    def _begin(self) -> None:
        self._refresh_params()
        acc = self._acc = [0] * len(self._snap.layout.names)
        seen, stack = set(self._params.exclude), self._stack
        top = _top_hooks(True)
        # Torch applies only the innermost pair, so ours calls the pair it shadows. If that pair is
        # another tracked model's (a teacher inside a student), skip it: innermost module wins.
        chain = getattr(top[0], "memexporter_chain", top) if top is not None else None
        outer_pack, unpack = chain if chain is not None else (None, _identity)

        def pack(t: torch.Tensor) -> Any:
            try:
                s = t.untyped_storage()
                ptr = s.data_ptr()
                if ptr not in seen:
                    seen.add(ptr)
                    acc[stack[-1]] += s.nbytes()
            except Exception:
                _record_slow(t, seen, acc, stack)
            # Never the tensor itself: a saved output would then reference its own grad_fn (a cycle).
            return t.detach() if outer_pack is None else outer_pack(t)

        pack.memexporter_chain = chain  # type: ignore[attr-defined]
        ctx = saved_tensors_hooks(pack, unpack)
        ctx.__enter__()
        self._ctx = ctx
        if self._allocated is not None:
            self._before.clear()
            self._before.append(self._allocated())
            self._dacc = [0] * len(acc)

    def _end(self) -> None:
        ctx, self._ctx = self._ctx, None
        top = _top_hooks(True)
        if ctx is None or top is None:
            raise RuntimeError("our saved-tensor hooks were popped by someone else")
        if top[0] is not ctx.pack_hook:
            # A pair pushed inside the forward and never popped: lift it, drop ours beneath it if
            # there, put it back. Ours must not stay pushed (it would count forever, unbounded).
            _pop_hooks()
            below = _top_hooks(True)
            if below is not None and below[0] is ctx.pack_hook:
                _pop_hooks()
            _push_hooks(*top)
            raise RuntimeError("saved-tensor hooks pushed inside the forward were not popped; "
                               "this forward's activations are not published")
        ctx.__exit__(None, None, None)
        if self._removed:
            return
        with self._write:
            self._snap = replace(self._snap, activation=tuple(self._acc))
        dacc, self._dacc = self._dacc, None
        if dacc is not None and self._allocated is not None and self._before:
            dacc[0] = self._allocated() - self._before.pop()
            names = self._snap.layout.names
            rows = [0] + [row for _, row in self._plan.hooked]
            self._deltas = MappingProxyType({names[r]: dacc[r] for r in rows})

    # --- parameters, gradients, optimizer state ------------------------------------------------

    def _refresh_params(self) -> None:
        """Recount parameter bytes if any parameter or buffer storage moved (``.to()``, ``.half()``)."""
        fp = self._plan.fingerprint()
        if fp != self._fingerprint:
            self._params = ledger.count_params(self._plan)
            self._fingerprint = fp
            with self._write:
                self._snap = replace(self._snap, parameter=self._params.bytes)

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
            _fail("optimizer step hook")
            return
        if known[1]:
            self._on_step(optimizer, args, kwargs)

    def _on_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        try:
            if os.getpid() != self._pid:
                return
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
            _fail("optimizer step hook")


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
