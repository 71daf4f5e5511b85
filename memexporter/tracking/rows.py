"""The row hooks of a recorded forward: which hooked module is running, and (optionally) what
each one's forward allocated. On the training thread only.

During a recorded forward (``forward.ForwardRecorder``), every hooked module that is not an entry
gets a pre-hook that pushes its row on the shared stack and a post-hook that pops it, so the
saved-tensor pack hook (``saved.py``) adds each saved storage to the innermost running module.
With ``cuda_forward_delta`` the same hooks also read allocated bytes before and after each
module's forward; ``deltas()`` sums them per row. The repeated blocks (``Plan.repeated``) get one
more pre-hook that adds the storage bytes of their tensor inputs (``inputs()``): what activation
checkpointing would keep of each block (``oom/levers.py``), a few microseconds a block, in recorded
forwards only. Between recorded forwards no row hook is on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from memexporter.tracking.errors import count_failure
from memexporter.tracking.plan import Plan
from memexporter.tracking.storage.plain import storage

__all__ = ["RowHooks"]

_compiling = torch.compiler.is_compiling
Hook = tuple[nn.Module, Callable[..., None], Callable[..., None], Callable[..., None] | None]


class RowHooks:
    """The row hooks of one tracked model, put on for each recorded forward and taken off after."""

    def __init__(self, plan: Plan, stack: list[int], allocated: Callable[[], int] | None) -> None:
        """``stack``: the recorder's rows of the running modules, innermost last (shared, not
        copied). ``allocated``: a reading of allocated bytes, for the forward deltas, or None."""
        self._plan, self._stack, self._allocated = plan, stack, allocated
        self._fns: list[Hook] | None = None  # built at the first recorded forward, then reused
        self._on: list[tuple[nn.Module, int]] = []  # (module, hook key) while they are on
        self._before: list[int] = []  # allocated bytes at each running module's start, innermost last
        self._dacc: list[int] | None = None  # bytes per row, of the recorded forward
        self._inputs: list[int] | None = None  # the repeated blocks' input bytes per row, of the recorded forward

    @property
    def on(self) -> bool:
        """Some row hook is on (a recorded forward runs, or one was left unfinished)."""
        return bool(self._on)

    def attach(self, skip_entries: bool, rows: int) -> None:
        """Put the row hooks on, for one recorded forward of ``rows`` rows; ``skip_entries``: the
        entries carry their own hooks. This happens once per recorded pass for every hooked
        module, so it writes the module's hook dicts directly, as torch's own
        ``register_forward_*hook`` does, without a ``RemovableHandle`` per hook (a third of a
        recorded forward's cost). No ``always_call``: after an exception, the entry's hook clears
        the stack and takes these off."""
        if self._fns is None:
            repeated = self._plan.repeated
            self._fns = [
                (m, *self._hooks_for(r), self._input_hook(r) if r in repeated else None) for m, r in self._plan.hooked
            ]
        entries = {id(m) for m, _ in self._plan.entries} if skip_entries else set()
        on = self._on
        for m, pre, post, measure in self._fns:
            if id(m) not in entries:
                key = RemovableHandle.next_id  # torch's own id counter: never a key of a real handle
                RemovableHandle.next_id += 1
                m._forward_pre_hooks[key] = pre
                m._forward_hooks[key] = post
                on.append((m, key))
                if measure is not None:  # its own key: detach() pops every key from both dicts
                    key = RemovableHandle.next_id
                    RemovableHandle.next_id += 1
                    m._forward_pre_hooks[key] = measure
                    on.append((m, key))
        self._inputs = [0] * rows if self._plan.repeated else None
        if self._allocated is not None:
            self._before[:] = [self._allocated()]  # the entry's own start
            self._dacc = [0] * rows

    def detach(self) -> None:
        """Take the row hooks off. Idempotent."""
        for m, key in self._on:
            m._forward_pre_hooks.pop(key, None)
            m._forward_hooks.pop(key, None)
        self._on.clear()

    def deltas(self, entry: int, names: tuple[str, ...]) -> Mapping[str, int] | None:
        """At the recorded forward's end: ``{module label: bytes}`` allocated after minus before
        each hooked module's forward and the entry's (``entry``), summed over calls. ``None``
        without ``cuda_forward_delta`` or when the forward's start was not read."""
        dacc, self._dacc = self._dacc, None
        if dacc is None or self._allocated is None or not self._before:
            return None
        dacc[entry] = self._allocated() - self._before.pop()
        return {names[r]: dacc[r] for r in [0, *(row for _, row in self._plan.hooked)]}

    def inputs(self) -> tuple[int, ...]:
        """At the recorded forward's end: the repeated blocks' input bytes per row (``()`` when the
        model has none)."""
        got, self._inputs = self._inputs, None
        return tuple(got) if got is not None else ()

    def _input_hook(self, row: int) -> Callable[..., None]:
        def measure(m: nn.Module, args: Any) -> None:
            if _compiling():  # traced by Dynamo (model.compile()): a storage read would break the graph
                return
            try:
                acc = self._inputs
                if acc is not None:
                    acc[row] += sum(storage(a)[1] for a in args if isinstance(a, torch.Tensor))
            except Exception:
                count_failure("forward pre-hook (block inputs)")

        return measure

    def _hooks_for(self, row: int) -> tuple[Callable[..., None], Callable[..., None]]:
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
