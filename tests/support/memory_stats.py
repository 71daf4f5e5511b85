"""The shape of ``torch.cuda.memory_stats()`` per torch version, derived from torch's source.

A real answer is a nested dict built in C++ (``THCPModule_memoryStats`` in
``torch/csrc/cuda/Module.cpp``, from ``DeviceStats`` in ``c10/core/CachingDeviceAllocator.h``),
which ``torch/cuda/memory.py`` flattens into ~120-150 sorted ``a.b.c`` keys:

- every ``StatArray`` becomes ``{all, small_pool, large_pool}`` x ``{current, peak, allocated,
  freed}`` (``statArrayToDict``); ``oversize_allocations`` and ``oversize_segments`` are single
  ``Stat``s (``statToDict``); the rest are scalars. ``max_split_size`` is ``SIZE_MAX`` cast to
  int64, so -1 when unset.
- torch 1.13: eight StatArrays, no ``requested_bytes``, and only ``num_alloc_retries``,
  ``num_ooms`` and ``max_split_size`` as scalars (Module.cpp of that release).
- torch 2.13: ``requested_bytes`` as a ninth StatArray, the scalars ``num_sync_all_streams``,
  ``num_device_alloc``, ``num_device_free`` and ``num_oom_rejections``, and
  ``reserved_bytes_by_private_pools`` keyed by ``MemPool.id`` tuples, flattened as ``"0_1"``
  (``DeviceStats`` and the ``memory_stats`` docstring of the 2.13 wheel).

Everything here builds SYNTHETIC answers of that exact shape; no number is measured.
"""

from __future__ import annotations

from typing import Any

POOLS = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")

STAT_ARRAYS: dict[str, tuple[str, ...]] = {
    "1.13": (
        "allocation",
        "segment",
        "active",
        "inactive_split",
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
    ),
    "2.13": (
        "allocation",
        "segment",
        "active",
        "inactive_split",
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "requested_bytes",
    ),
}
SCALARS: dict[str, tuple[str, ...]] = {
    "1.13": ("num_alloc_retries", "num_ooms", "max_split_size"),
    "2.13": (
        "num_alloc_retries",
        "num_ooms",
        "max_split_size",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
        "num_oom_rejections",
    ),
}
SINGLE_STATS = ("oversize_allocations", "oversize_segments")
PRIVATE_POOLS = "reserved_bytes_by_private_pools"  # 2.13 only

Triple = tuple[int, int, int]  # (current, peak, allocated); freed = allocated - current


def stat(current: int = 0, peak: int = 0, allocated: int = 0) -> dict[str, int]:
    """One ``Stat``: ``freed`` follows from ``current = allocated - freed``."""
    return {"current": current, "peak": peak, "allocated": allocated, "freed": allocated - current}


def array(small: Triple = (0, 0, 0), large: Triple = (0, 0, 0), peak: int = 0) -> dict[str, dict[str, int]]:
    """One ``StatArray``: ``all`` sums the pools, except its peak, which the allocator tracks itself."""
    s, lg = stat(*small), stat(*large)
    total = {f: s[f] + lg[f] for f in FIELDS}
    total["peak"] = peak
    return {"all": total, "small_pool": s, "large_pool": lg}


def nested(
    version: str,
    arrays: dict[str, dict[str, dict[str, int]]],
    scalars: dict[str, int],
    private_pools: dict[tuple[int, int], dict[str, dict[str, int]]] | None = None,
) -> dict[Any, Any]:
    """A ``memory_stats_as_nested_dict()`` answer of ``version``'s shape; absent arrays are zeros."""
    unknown = set(arrays) - set(STAT_ARRAYS[version]) | set(scalars) - set(SCALARS[version])
    if unknown:
        raise ValueError(f"torch {version} reports no {sorted(unknown)}")
    out: dict[Any, Any] = {name: scalars.get(name, 0) for name in SCALARS[version]}
    out.update({name: arrays.get(name, array()) for name in STAT_ARRAYS[version]})
    out.update({name: stat() for name in SINGLE_STATS})
    if version != "1.13":
        out[PRIVATE_POOLS] = dict(private_pools or {})
    return out


def flatten(stats: dict[Any, Any]) -> dict[str, int]:
    """What ``torch.cuda.memory_stats()`` makes of a nested answer (its ``_recurse_add_to_result``)."""
    out: list[tuple[str, int]] = []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                part = "_".join(str(p) for p in key) if isinstance(key, tuple) else str(key)
                walk(f"{prefix}.{part}" if prefix else part, value)
        else:
            out.append((prefix, obj))

    walk("", stats)
    return dict(sorted(out))


def unflatten(flat: dict[str, int]) -> dict[Any, Any]:
    """The nested answer behind a flat one (private-pool ids back to tuples), for the stand-ins."""
    out: dict[Any, Any] = {}
    for key, value in flat.items():
        parts: list[Any] = key.split(".")
        if parts[0] == PRIVATE_POOLS and len(parts) > 1:
            parts[1] = tuple(int(p) for p in parts[1].split("_"))
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def zeros_like(flat: dict[str, int]) -> dict[str, int]:
    """A fresh allocator's answer with the same keys (a device the process never used)."""
    return {k: (-1 if k == "max_split_size" else 0) for k in flat if not k.startswith(PRIVATE_POOLS)}


def host_memory_stats(held: int, active: int, blocks: int, active_blocks: int) -> dict[str, float]:
    """SYNTHETIC ``torch.cuda.host_memory_stats()`` in torch 2.13's shape (its docstring lists the
    keys; torch/cuda/memory.py flattens and sorts them as memory_stats() does): ``held`` bytes in
    ``blocks`` pinned blocks (in use and cached), ``active`` bytes in ``active_blocks`` of them handed
    out. Timings in microseconds; ``avg`` is a float, the rest ints. torch before 2.6 has no such call."""

    def stat(current: int, grown: int) -> dict[str, int]:
        return {"current": current, "peak": grown, "allocated": grown, "freed": grown - current}

    nested_stats: dict[str, Any] = {
        "allocations": stat(blocks, blocks + 3),
        "allocated_bytes": stat(held, held + held // 8),
        "active_requests": stat(active_blocks, blocks),
        "active_bytes": stat(active, held),
        "num_host_alloc": blocks + 3,
        "num_host_free": 3,
        "host_alloc_time": {"total": 41822, "max": 9120, "min": 402, "count": blocks + 3, "avg": 41822 / (blocks + 3)},
        "host_free_time": {"total": 1210, "max": 611, "min": 288, "count": 3, "avg": 1210 / 3},
    }
    return dict(sorted(flatten(nested_stats).items()))  # type: ignore[arg-type]


# --- Other device families (issue 26). Sources: /tmp-free citations in each fixture's provenance. ---

XPU_STAT_ARRAYS: dict[str, tuple[str, ...]] = {
    # torch/csrc/xpu/Module.cpp THXPModule_memoryStats: four *_bytes arrays up to torch 2.10 ...
    "2.10": ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"),
    # ... and nine from 2.11 (pytorch/pytorch#169812); never any scalar or oversize stat.
    "2.13": (
        "allocation",
        "segment",
        "active",
        "inactive_split",
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "requested_bytes",
    ),
}
# torch/csrc/DeviceAccelerator.cpp (torch.accelerator.memory_stats): every statistic of DeviceStats
# but num_oom_rejections and the private pools; 122 flat keys, whatever the allocator fills.
ACCELERATOR_SCALARS = (
    "num_alloc_retries",
    "num_ooms",
    "max_split_size",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
)


def xpu_nested(version: str, arrays: dict[str, dict[str, dict[str, int]]]) -> dict[str, Any]:
    """A ``torch._C._xpu_memoryStats()`` answer of torch ``version``'s shape; absent arrays are zeros."""
    unknown = set(arrays) - set(XPU_STAT_ARRAYS[version])
    if unknown:
        raise ValueError(f"torch {version}'s XPU allocator reports no {sorted(unknown)}")
    return {name: arrays.get(name, array()) for name in XPU_STAT_ARRAYS[version]}


def aggregate_only(current: int, peak: int, allocated: int) -> dict[str, dict[str, int]]:
    """A ``StatArray`` whose allocator fills only the aggregate entry (MPS: no pools)."""
    return {"all": stat(current, peak, allocated), "small_pool": stat(), "large_pool": stat()}


def accelerator_nested(arrays: dict[str, dict[str, dict[str, int]]], scalars: dict[str, int]) -> dict[str, Any]:
    """A ``torch._C._accelerator_getDeviceStats()`` answer: every key, the unfilled ones zero."""
    out: dict[str, Any] = {name: scalars.get(name, 0) for name in ACCELERATOR_SCALARS}
    out.update({name: arrays.get(name, array()) for name in STAT_ARRAYS["2.13"]})
    out.update({name: stat() for name in SINGLE_STATS})
    return out
