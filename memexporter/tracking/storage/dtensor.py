"""Storage rules of DTensors (FSDP2's ``fully_shard``, tensor parallelism): a rank holds its local shard.

A DTensor has no storage of its own: its ``_local_tensor`` is what this rank holds, and its logical
size (``numel()``) is the whole, unsharded tensor, which goes in
``memexporter_module_parameter_unsharded_bytes``.
"""

from __future__ import annotations

import torch

__all__ = ["local", "sharded"]


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory this rank holds: a DTensor's local shard (FSDP2, tensor parallel)."""
    while True:
        inner = getattr(t, "_local_tensor", None)
        if not isinstance(inner, torch.Tensor):
            return t
        t = inner


def sharded(p: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``(local shard, unsharded bytes)`` of a DTensor parameter, None for any other tensor."""
    shard = local(p)
    if shard is p:
        return None
    return shard, p.numel() * p.element_size()
