"""Forward-side hooks of a tracked model, on the training thread: module stack and saved tensors.

``ForwardHooks`` holds the hook methods ``TrackHandle`` (tracking/modules.py) registers; the handle
owns the state they use and sets it up. A root forward's pre-hook pushes a ``saved_tensors_hooks``
pair whose pack hook counts storage bytes into the row of the innermost running module, and its
post-hook pops the pair and publishes the counts. Hooks never raise: failures are counted by
``hook_errors()`` and the first one is logged.
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

from memexporter.tracking.ledger import ParamCount, Plan, storage
from memexporter.tracking.snapshots import Snapshot

log = logging.getLogger("memexporter")

_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_push_hooks = torch._C._autograd._push_saved_tensors_default_hooks
_pop_hooks = torch._C._autograd._pop_saved_tensors_default_hooks
_hooks_enabled = torch._C._autograd._saved_tensors_hooks_is_enabled  # type: ignore[attr-defined]
_graph_task = torch._C._current_graph_task_id  # -1 outside backward
# Run a hook eagerly even inside a compiled region (a graph break; 0.6 us per call in eager).
_eager = cast(Callable[[Callable[..., None]], Callable[..., None]], torch.compiler.disable)

_errors = 0
_errors_lock = threading.Lock()


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


class ForwardHooks:
    """The forward pre-hooks and hooks of a ``TrackHandle``: running-module stack, saved-tensor bytes."""

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
    _allocated: Callable[[], int] | None
    _dacc: list[int] | None
    _before: list[int]
    _deltas: Mapping[str, int]
    _removed: bool
    _sample: Callable[[], None]
    remove: Callable[[], None]  # TrackHandle.remove
    _refresh_params: Callable[[], None]  # StepHooks._refresh_params

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
