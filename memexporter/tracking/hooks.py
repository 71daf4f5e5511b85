"""Forward-side hooks of a tracked model, on the training thread: entries, rows, saved tensors.

``ForwardHooks`` holds the hook methods ``TrackHandle`` (tracking/modules.py) registers; the handle
owns the state they use and sets it up. What a forward costs is kept small on purpose:

- **Permanent hooks sit on the entries only**: the root, and until the root is seen running a
  grad-enabled forward, its top-level hooked children (a ``LightningModule`` whose
  ``training_step`` calls ``self.net`` never calls the root). They count nesting and sample the
  step peak at the end of each outermost forward.
- **Few forwards are recorded** (``schedule.py``: at most one pass a second and one in eight).
  Only then does the entry's pre-hook push a ``saved_tensors_hooks`` pair (``saved.py``: the pack
  hook adds each saved storage's bytes to the row of the innermost running module) and register
  the row hooks of the other hooked modules; its post-hook pops the pair, takes the row hooks off
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
from dataclasses import replace
from types import MappingProxyType
from typing import Any, cast

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.hooks import RemovableHandle

from memexporter.tracking import saved
from memexporter.tracking.errors import count_failure, hook_errors
from memexporter.tracking.ledger import ParamCount
from memexporter.tracking.plan import Plan
from memexporter.tracking.schedule import Schedule
from memexporter.tracking.snapshots import Snapshot

__all__ = ["ForwardHooks", "hook_errors"]

log = logging.getLogger("memexporter")

_hooks_enabled = torch._C._autograd._saved_tensors_hooks_is_enabled  # type: ignore[attr-defined]
_graph_task = torch._C._current_graph_task_id  # -1 outside backward
# Run a hook eagerly even inside a compiled region (a graph break; 0.6 us per call in eager).
_eager = cast(Callable[[Callable[..., None]], Callable[..., None]], torch.compiler.disable)


class ForwardHooks:
    """The entry hooks, row hooks and saved-tensor pack hook of a ``TrackHandle``."""

    # Set up by TrackHandle.__init__ (only annotated here, for the type checker).
    _plan: Plan
    _pid: int
    _params: ParamCount
    _snap: Snapshot
    _write: threading.Lock
    _stack: list[int]
    _depth: int
    _ctx: saved_tensors_hooks | None
    _acc: list[int]
    _seen: set[int]
    _schedule: Schedule  # which passes are recorded
    _life: threading.Lock  # the record decision against remove() from another thread
    _entry: int  # row of the entry being recorded
    _root_seen: bool
    _entry_hooks: list[RemovableHandle]  # the top-level children's, until the root is seen
    _rows_on: list[tuple[nn.Module, int]]  # (module, hook key) of the row hooks, while recording
    _row_fns: list[tuple[nn.Module, Callable[..., None], Callable[..., None]]] | None  # built once
    _allocated: Callable[[], int] | None
    _dacc: list[int] | None
    _before: list[int]
    _deltas: Mapping[str, int]
    _removed: bool
    _forward_begin: Callable[[], None]  # phases.forward_begin: the automatic "forward" phase
    _forward_end: Callable[[bool], None]  # phases.forward_end: also a step-peak sample
    _finish_remove: Callable[[], None]  # TrackHandle
    _refresh_params: Callable[[], None]  # StepHooks._refresh_params

    def _entry_hooks_for(self, row: int) -> tuple[Callable[..., None], Callable[..., None]]:
        def pre(m: nn.Module, args: Any) -> None:
            self._enter(row)

        def post(m: nn.Module, args: Any, out: Any) -> None:
            self._leave()

        return _eager(pre), _eager(post)

    def _enter(self, row: int) -> None:
        if self._removed:  # removed while a forward ran, or from another thread: finish here, in a
            self._finish_remove()  # pre-hook (torch iterates a copy of the pre-hooks)
            return
        self._depth += 1
        try:
            if self._depth > 1:  # an entry called inside another (a child inside the root)
                if self._ctx is not None:
                    self._stack.append(row)
                return
            # A checkpoint recompute runs inside backward (a graph task is running): it is not a
            # new forward. Only a grad-enabled forward on the owning process records.
            if _graph_task() != -1 or os.getpid() != self._pid:
                return
            self._forward_begin()
            if not (torch.is_grad_enabled() and _hooks_enabled()):
                return
            with self._life:
                if self._removed:
                    return
                if row == 0 and not self._root_seen:  # the root is called: children need no entry hooks
                    self._root_seen = True
                    self._detach(self._entry_hooks)
                record, fresh = self._schedule.enter(row, forced=saved.outer_recording())
                if not record:
                    return
                if fresh:
                    self._acc = [0] * len(self._snap.layout.names)
                    self._refresh_params()
                    self._seen = set(self._params.exclude)
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

    def _heal(self) -> None:
        """At an optimizer step, no forward of the model runs: close a recording that a
        ``KeyboardInterrupt`` inside a forward left open (torch skips ``always_call`` hooks for it)."""
        self._schedule.step()
        if self._depth or self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            if ctx is not None and saved.on_top(ctx):
                ctx.__exit__(None, None, None)
            self._depth = 0
            self._stack.clear()
            self._detach_rows()

    def _row_hooks_for(self, row: int) -> tuple[Callable[..., None], Callable[..., None]]:
        stack, before, allocated = self._stack, self._before, self._allocated
        if allocated is None:

            def pre(m: nn.Module, args: Any) -> None:
                stack.append(row)

            def post(m: nn.Module, args: Any, out: Any) -> None:
                if stack:  # balanced with pre (an exception skips it: the entry hook then clears the stack)
                    stack.pop()

            return pre, post

        def dpre(m: nn.Module, args: Any) -> None:
            stack.append(row)
            try:
                before.append(allocated())
            except Exception:
                count_failure("forward pre-hook (cuda_forward_delta)")

        def dpost(m: nn.Module, args: Any, out: Any) -> None:
            if stack:
                stack.pop()
            try:
                if self._dacc is not None and before:
                    self._dacc[row] += allocated() - before.pop()
            except Exception:
                count_failure("forward hook (cuda_forward_delta)")

        return dpre, dpost

    @staticmethod
    def _detach(handles: list[RemovableHandle]) -> None:
        for h in handles:
            h.remove()
        handles.clear()

    def _attach_rows(self) -> None:
        """Put the row hooks on, for one recorded forward. This happens once per recorded pass for
        every hooked module, so it writes the module's hook dicts directly, as torch's own
        ``register_forward_*hook`` does, without a ``RemovableHandle`` per hook (a third of a
        recorded forward's cost). No ``always_call``: after an exception, the entry's hook clears
        the stack and takes these off."""
        if self._row_fns is None:
            self._row_fns = [(m, *self._row_hooks_for(r)) for m, r in self._plan.hooked]
        entries = {id(m) for m, _ in self._plan.entries} if self._entry_hooks else set()
        on = self._rows_on
        for m, pre, post in self._row_fns:
            if id(m) not in entries:
                key = RemovableHandle.next_id  # torch's own id counter: never a key of a real handle
                RemovableHandle.next_id += 1
                m._forward_pre_hooks[key] = pre
                m._forward_hooks[key] = post
                on.append((m, key))

    def _detach_rows(self) -> None:
        for m, key in self._rows_on:
            m._forward_pre_hooks.pop(key, None)
            m._forward_hooks.pop(key, None)
        self._rows_on.clear()

    def _begin(self, row: int) -> None:
        acc, seen, stack = self._acc, self._seen, self._stack
        stack.append(row)
        self._entry = row
        ctx = saved.push(acc, seen, stack, self._schedule)
        self._ctx = ctx
        self._attach_rows()
        if self._allocated is not None:
            self._before.clear()
            self._before.append(self._allocated())
            self._dacc = [0] * len(acc)

    def _end(self) -> None:
        ctx, self._ctx = self._ctx, None
        # Other modules' hooks: torch is iterating only this entry's own right now.
        self._detach_rows()
        if ctx is None:
            raise RuntimeError("no recorded forward to end")
        saved.pop(ctx)
        if self._removed:
            return
        with self._write:
            self._snap = replace(self._snap, activation=tuple(self._acc))
        dacc, self._dacc = self._dacc, None
        if dacc is not None and self._allocated is not None and self._before:
            dacc[self._entry] = self._allocated() - self._before.pop()
            names = self._snap.layout.names
            rows = [0] + [row for _, row in self._plan.hooked]
            self._deltas = MappingProxyType({names[r]: dacc[r] for r in rows})
