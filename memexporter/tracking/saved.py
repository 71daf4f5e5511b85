"""The saved-tensor pair of a recorded forward: a pack hook that counts bytes per row, pushed at the
start of the forward and popped at its end, without disturbing the user's own pairs.

The pack hook adds the storage bytes of each tensor saved for backward to the row on top of the
running-module stack, each storage once (parameters and buffers are pre-seeded as seen). Torch
applies only the innermost pair, so ours calls the pair it shadows (``save_on_cpu``, a user's
counting pair): their pack's result is what is saved, and their unpack is ours.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from memexporter.tracking.errors import count_failure
from memexporter.tracking.ledger import storage

_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_push_hooks = torch._C._autograd._push_saved_tensors_default_hooks
_pop_hooks = torch._C._autograd._pop_saved_tensors_default_hooks
_Parameter = nn.Parameter


def _record_slow(t: torch.Tensor, seen: set[int], acc: list[int], stack: list[int]) -> None:
    try:
        key, nbytes = storage(t)
        if key not in seen:
            seen.add(key)
            acc[stack[-1]] += nbytes
    except Exception:
        count_failure("saved-tensor pack hook")


def _identity(x: Any) -> Any:
    return x


class Backward(Protocol):
    """Where the unpack hook notes that a backward read the recorded pass's saves (a ``Schedule``)."""

    backward: bool


def push(acc: list[int], seen: set[int], stack: list[int], seen_backward: Backward) -> saved_tensors_hooks:
    """Enter a pair whose pack hook adds saved bytes to ``acc[stack[-1]]``; returns it (entered).
    Its unpack sets ``seen_backward.backward``: a backward ran over these saves.

    A saved ``nn.Parameter``, or a view of one, is a parameter, not an activation, wherever its
    storage is: FSDP (1 and 2) all-gathers each module's parameters into fresh storage for its
    forward and backward, which the parameters' own storages (pre-seeded in ``seen``) do not cover.
    """
    top = _top_hooks(True)
    # If the pair we shadow is another tracked model's (a teacher inside a student), skip it:
    # each save counts once, for the innermost tracked module.
    chain = getattr(top[0], "memexporter_chain", top) if top is not None else None
    outer_pack, unpack = chain if chain is not None else (None, _identity)

    def pack(t: torch.Tensor) -> Any:
        try:
            # `type() is`, not isinstance(): Parameter's metaclass makes isinstance a Python call.
            # An FSDP unsharded parameter is a plain Parameter; a DTensor one is seen by storage.
            if not (type(t) is _Parameter or type(t._base) is _Parameter):
                s = t.untyped_storage()
                ptr = s.data_ptr()
                if ptr not in seen:
                    seen.add(ptr)
                    acc[stack[-1]] += s.nbytes()
        except Exception:
            _record_slow(t, seen, acc, stack)
        # Never the tensor itself: a saved output would then reference its own grad_fn (a cycle).
        return t.detach() if outer_pack is None else outer_pack(t)

    def unpack_seen(packed: Any) -> Any:
        seen_backward.backward = True
        return unpack(packed)

    pack.memexporter_chain = chain  # type: ignore[attr-defined]
    ctx = saved_tensors_hooks(pack, unpack_seen)
    ctx.__enter__()
    return ctx


def outer_recording() -> bool:
    """Whether a tracked model's pair is the innermost on this thread: one records around us."""
    top = _top_hooks(True)
    return top is not None and hasattr(top[0], "memexporter_chain")


def on_top(ctx: saved_tensors_hooks) -> bool:
    """Whether ``ctx`` is the innermost pair on this thread (only then may this thread pop it)."""
    top = _top_hooks(True)
    return top is not None and top[0] is ctx.pack_hook


def pop(ctx: saved_tensors_hooks) -> None:
    """Leave ``ctx``. Raises ``RuntimeError`` (for the caller to count) when the counts of this
    forward must not be published: our pair was popped by someone else, or a pair pushed inside the
    forward was never popped (ours is then taken out from under it: it must never stay pushed, it
    would count forever, unbounded)."""
    top = _top_hooks(True)
    if top is None:
        raise RuntimeError("our saved-tensor hooks were popped by someone else")
    if top[0] is not ctx.pack_hook:
        _pop_hooks()
        below = _top_hooks(True)
        if below is not None and below[0] is ctx.pack_hook:
            _pop_hooks()
        _push_hooks(*top)
        raise RuntimeError(
            "saved-tensor hooks pushed inside the forward were not popped; this forward's activations are not published"
        )
    ctx.__exit__(None, None, None)
