"""Forward-side hooks of a tracked model, on the training thread: entries, rows, saved tensors.

A ``ForwardRecorder`` is one part of a ``TrackHandle`` (``modules.py``): it owns the hooks on the
model's forward and their state, and publishes activation bytes through the handle's
``counts.ModelCounts``. What a forward costs is kept small on purpose:

- **Permanent hooks sit on the entries only**: the root, and until the root is seen running a
  grad-enabled forward, its top-level hooked children (a ``LightningModule`` whose
  ``training_step`` calls ``self.net`` never calls the root). They count nesting, measure the
  step's input from an outermost training forward's arguments (``inputs.py``: shapes only), and
  sample the step peak at the end of each outermost forward.
- **Few forwards are recorded** (``schedule.py``: at most one pass a second and one in eight).
  Only then does the entry's pre-hook push a ``saved_tensors_hooks`` pair (``saved.py``: the pack
  hook adds each saved storage's bytes to the row of the innermost running module) and register
  the row hooks of the other hooked modules (``rows.py``); its post-hook pops the pair, takes the row hooks off
  and publishes the counts. Forwards in between, training or evaluation, pay two hook calls per
  entry and nothing per module.

The saved-tensor pair itself is in ``saved.py``. Hooks never raise: failures are counted by
``hook_errors()`` (``errors.py``) and the first one is logged.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, cast

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.hooks import RemovableHandle

from memexporter.tracking import inputs, phases, saved
from memexporter.tracking.counts import ModelCounts
from memexporter.tracking.errors import count_failure
from memexporter.tracking.rows import RowHooks
from memexporter.tracking.schedule import Schedule

__all__ = ["ForwardRecorder", "backend_allocated"]

log = logging.getLogger("memexporter")

_hooks_enabled = torch._C._autograd._saved_tensors_hooks_is_enabled  # type: ignore[attr-defined]
_graph_task = torch._C._current_graph_task_id  # -1 outside backward
# Run a hook eagerly even inside a compiled region (a graph break; 0.6 us per call in eager).
_eager = cast(Callable[[Callable[..., None]], Callable[..., None]], torch.compiler.disable)


class ForwardRecorder:
    """The entry hooks, row hooks and saved-tensor pair of one tracked model, and their state.

    Lifecycle: ``attach()`` once; ``end_pass()`` at each optimizer step over the model; ``close()``
    then ``detach()`` on removal. Every method runs on a training thread except ``close()``.
    """

    def __init__(
        self, counts: ModelCounts, *, compiled: bool, allocated: Callable[[], int] | None, finish: Callable[[], None]
    ) -> None:
        """``compiled``: the root is a ``torch.compile`` wrapper (its children are traced, never
        entries). ``allocated``: a reading of allocated bytes for ``cuda_forward_delta``, or None.
        ``finish``: the handle's own removal, called by the first pre-hook after ``close()``."""
        self._counts, self._plan, self._finish = counts, counts.plan, finish
        self._compiled = compiled
        self._stack: list[int] = []  # rows of the modules running now, innermost last (recorded forwards)
        self._depth = 0  # nesting of entry forwards
        self._ctx: saved_tensors_hooks | None = None  # our pair, while a recorded forward runs
        self._acc: list[int] = []  # activation bytes per row, of the forward being recorded
        self._seen: set[int] = set()  # storages already counted in it (parameters from the start)
        self._schedule = Schedule()  # which passes are recorded
        self._life = threading.Lock()  # the record decision against close() from another thread
        self._entry = 0  # row of the entry being recorded
        self._root_seen = compiled  # until then, the top-level children are entries too
        self._root_hooks: list[RemovableHandle] = []
        self._entry_hooks: list[RemovableHandle] = []  # the top-level children's, until the root is seen
        self._rows = RowHooks(self._plan, self._stack, allocated)
        self._deltas: Mapping[str, int] = MappingProxyType({})
        self.removed = False
        # Bound once: the automatic "forward" phase, and a step-peak sample at each forward's end.
        self._forward_begin: Callable[[], None] = phases.forward_begin
        self._forward_end: Callable[[bool], None] = phases.forward_end
        self._note: Callable[[Any, dict[str, Any] | None], None] = inputs.note_call

    def attach(self, model: nn.Module) -> None:
        """Hook the entries: the root first (its hooks run eagerly, also under ``model.compile()``),
        then its top-level hooked children. A failure leaves what was hooked to ``detach()``."""
        pre, post = self._entry_hooks_for(0)
        self._root_hooks.append(model.register_forward_pre_hook(pre, prepend=True, with_kwargs=True))
        self._root_hooks.append(model.register_forward_hook(post, always_call=True))
        # Under torch.compile(model) Dynamo traces the inner modules: hooks there would run at
        # trace time, not interleaved with the saves, so activations go to the root row instead.
        for m, row in [] if self._compiled else self._plan.entries:
            pre, post = self._entry_hooks_for(row)
            self._entry_hooks.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            self._entry_hooks.append(m.register_forward_hook(post, always_call=True))

    def close(self) -> bool:
        """Stop recording, for ``TrackHandle.remove()``. ``False`` when a forward is being recorded
        on another thread: only that thread can pop its saved-tensor pair, and removing a module's
        hooks while it runs would change the dicts torch is iterating, so that forward's end pops
        the pair and the next pre-hook takes the hooks off (``finish``)."""
        with self._life:  # not between another thread's decision to record and its _begin()
            self.removed = True
            ctx = self._ctx
            if ctx is not None:
                if not saved.on_top(ctx):
                    return False
                self._ctx = None  # mid-forward, on this thread
                ctx.__exit__(None, None, None)
        return True

    def detach(self) -> None:
        """Take every forward hook off. Idempotent."""
        for handles in (self._root_hooks, self._entry_hooks):
            self._detach(handles)
        self._rows.detach()

    def deltas(self) -> dict[str, int]:
        """``{module label: bytes}`` of the last recorded forward (``TrackHandle.forward_deltas``)."""
        return dict(self._deltas)

    @property
    def idle(self) -> bool:
        """No forward of the model is running or being recorded (what a finished pass leaves)."""
        return self._depth == 0 and self._ctx is None and not self._stack and not self._rows.on

    def _entry_hooks_for(self, row: int) -> tuple[Callable[..., None], Callable[..., None]]:
        def pre(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            self._enter(row, args, kwargs)

        def post(m: nn.Module, args: Any, out: Any) -> None:
            self._leave()

        return _eager(pre), _eager(post)

    def _enter(self, row: int, args: Any = (), kwargs: dict[str, Any] | None = None) -> None:
        if self.removed:  # removed while a forward ran, or from another thread: finish here, in a
            self._finish()  # pre-hook (torch iterates a copy of the pre-hooks)
            return
        self._depth += 1
        try:
            if self._depth > 1:  # an entry called inside another (a child inside the root)
                if self._ctx is not None:
                    self._stack.append(row)
                return
            # A checkpoint recompute runs inside backward (a graph task is running): it is not a
            # new forward. Only a grad-enabled forward on the owning process records.
            if _graph_task() != -1 or os.getpid() != self._counts.pid:
                return
            self._forward_begin()
            grad = torch.is_grad_enabled()
            if grad:  # a training forward: its input is the step's (shapes only, inputs.py)
                self._note(args, kwargs)
            if not (grad and _hooks_enabled()):
                return
            with self._life:
                if self.removed:
                    return
                if row == 0 and not self._root_seen:  # the root is called: children need no entry hooks
                    self._root_seen = True
                    self._detach(self._entry_hooks)
                record, fresh = self._schedule.enter(row, forced=saved.outer_recording())
                if not record:
                    return
                if fresh:
                    self._counts.refresh_params()
                    self._acc = [0] * len(self._counts.snapshot.layout.names)
                    self._seen = set(self._counts.params.exclude)
                self._begin(row)
        except Exception:
            count_failure("forward pre-hook")

    def _leave(self) -> None:
        try:
            self._depth = max(0, self._depth - 1)
            if self._depth:
                if self._ctx is not None and len(self._stack) > 1:
                    self._stack.pop()
                return
            self._stack.clear()  # also heals a stack left unbalanced by a failed hook
            if self._ctx is not None:
                self._end()
            # Removed meanwhile: the hooks come off at the next pre-hook, not here (a forward that
            # raised has torch iterating this module's forward hooks right now).
            if _graph_task() == -1:
                self._forward_end(torch.is_grad_enabled())
        except Exception:
            count_failure("forward hook")

    def end_pass(self) -> None:
        """An optimizer step over the model ended the pass. No forward of the model runs then:
        close a recording that a ``KeyboardInterrupt`` inside a forward left open (torch skips
        ``always_call`` hooks for it)."""
        self._schedule.step()
        if self._depth or self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            if ctx is not None and saved.on_top(ctx):
                ctx.__exit__(None, None, None)
            self._depth = 0
            self._stack.clear()
            self._rows.detach()

    @staticmethod
    def _detach(handles: list[RemovableHandle]) -> None:
        for h in handles:
            h.remove()
        handles.clear()

    def _begin(self, row: int) -> None:
        acc, seen, stack = self._acc, self._seen, self._stack
        stack.append(row)
        self._entry = row
        ctx = saved.push(acc, seen, stack, self._schedule)
        self._ctx = ctx
        self._rows.attach(skip_entries=bool(self._entry_hooks), rows=len(acc))

    def _end(self) -> None:
        ctx, self._ctx = self._ctx, None
        # Other modules' hooks: torch is iterating only this entry's own right now.
        self._rows.detach()
        if ctx is None:
            raise RuntimeError("no recorded forward to end")
        saved.pop(ctx)
        if self.removed:
            return
        self._counts.publish_activation(tuple(self._acc), self._rows.inputs())
        deltas = self._rows.deltas(self._entry, self._counts.snapshot.layout.names)
        if deltas is not None:
            self._deltas = MappingProxyType(deltas)


def backend_allocated(counts: ModelCounts) -> Callable[[], int]:
    """Allocated bytes on the CUDA device of the model's parameters (0 while it has none), read
    from the backend: ``backends/cuda.py`` is the only module that touches ``torch.cuda``."""
    from memexporter.backends.cuda import TorchBackend

    backend = TorchBackend()

    def allocated() -> int:
        index = counts.params.cuda_index
        return 0 if index is None else backend.reading(index).used

    return allocated
