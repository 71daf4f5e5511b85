"""Storage rules of torch's own tensors: what a parameter, gradient or saved tensor holds.

Two ways to count one tensor, each piece of memory once:

- ``owned``: a parameter, gradient or optimizer-state tensor counts its **own** bytes: a tied weight
  is one tensor, counted once; a view into a shared bucket (DDP's ``gradient_as_bucket_view``, a
  flat parameter) is charged to its own parameter, keyed by its first element's address;
- ``storage``: a saved activation counts the **whole storage** it keeps alive.

A DTensor is first reduced to its local shard (``dtensor.local``).
"""

from __future__ import annotations

import torch

from memexporter.tracking.storage.dtensor import local

__all__ = ["owned", "storage"]


def storage(t: torch.Tensor) -> tuple[int, int]:
    """``(identity, bytes)`` of the memory a tensor holds alive: its whole storage, so views count
    once. For activations: a saved view keeps its whole storage alive."""
    t = local(t)
    if t.is_sparse:
        v, i = t._values(), t._indices()
        return id(t), v.numel() * v.element_size() + i.numel() * i.element_size()
    try:
        s = t.untyped_storage()
        ptr = s.data_ptr()
    except Exception:  # other wrapper subclasses and storage-less tensors: the logical size
        return id(t), t.numel() * t.element_size()
    return (ptr, s.nbytes()) if ptr else (0, 0)  # meta or empty: holds no memory


def owned(t: torch.Tensor) -> tuple[int, int]:
    """``(identity, bytes)`` of a parameter, gradient or optimizer-state tensor: its own bytes.

    A view into a shared buffer counts its own elements, keyed by its first element's address, so
    each parameter is charged for its own slice and the buffer is counted once in pieces. Never
    more than the storage holds (an expanded tensor). A DTensor counts its local shard.
    """
    t = local(t)
    if t.is_sparse:
        return storage(t)
    try:
        ptr, cap = t.data_ptr(), t.untyped_storage().nbytes()
    except Exception:
        return id(t), t.numel() * t.element_size()
    return (ptr, min(t.numel() * t.element_size(), cap)) if ptr else (0, 0)
