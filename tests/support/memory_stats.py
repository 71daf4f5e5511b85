"""The shape of ``torch.cuda.memory_stats()`` per torch release, read off torch's own wheels.

A real answer is a nested dict built in C++ (``THCPModule_memoryStats`` in
``torch/csrc/cuda/Module.cpp``, from ``DeviceStats`` in ``c10/core/CachingDeviceAllocator.h``),
which ``torch/cuda/memory.py`` flattens into ~120-150 sorted ``a.b.c`` keys:

- every ``StatArray`` becomes ``{all, small_pool, large_pool}`` x ``{current, peak, allocated,
  freed}`` (``statArrayToDict``); ``oversize_allocations`` and ``oversize_segments`` are single
  ``Stat``s (``statToDict``); the rest are scalars. ``max_split_size`` is ``SIZE_MAX`` cast to
  int64, so -1 when unset.
- torch 1.13: eight StatArrays, and only ``num_alloc_retries``, ``num_ooms`` and ``max_split_size``
  as scalars (Module.cpp of that release). What later releases added is ``ADDED``: the key names
  that each release's ``torch/lib/libtorch_python.so`` on PyPI holds, checked for 2.0.1, 2.1.2,
  2.2.2, 2.3.1, 2.4.1, 2.5.1, 2.11.0, 2.12.0, 2.13.0, 2.14.0 and 2.15.0.
- ``reserved_bytes_by_private_pools`` (2.13 on) is keyed by ``MemPool.id`` tuples; the
  ``memory_stats()`` of the same release joins them as ``"0_1"`` (its ``_format_key``). A torch
  before 2.13 would fail on such a key (``str + tuple``), and never receives one.

``shape(release)`` is one release's key set. The stand-ins (``cuda_standins.py``) answer a
fixture's figures in the installed torch's shape (``reported``), so torch's own Python flattens
what that torch's C++ would have handed it. Everything else here builds SYNTHETIC answers; no
number is measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

POOLS = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")
SINGLE_STATS = ("oversize_allocations", "oversize_segments")
PRIVATE_POOLS = "reserved_bytes_by_private_pools"

BASE_ARRAYS = (  # torch 1.13
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
)
BASE_SCALARS = ("num_alloc_retries", "num_ooms", "max_split_size")  # torch 1.13
# (release, StatArrays added, scalars added, private pools added), oldest first.
ADDED: tuple[tuple[tuple[int, int], tuple[str, ...], tuple[str, ...], bool], ...] = (
    ((2, 0), ("requested_bytes",), (), False),
    ((2, 3), (), ("num_sync_all_streams", "num_device_alloc", "num_device_free"), False),
    ((2, 12), (), ("num_oom_rejections",), False),
    ((2, 13), (), (), True),
)


@dataclass(frozen=True)
class Shape:
    """What one torch release's ``_cuda_memoryStats`` answers: its StatArrays, its scalars, and
    whether it has ``reserved_bytes_by_private_pools``."""

    arrays: tuple[str, ...]
    scalars: tuple[str, ...]
    private_pools: bool


def release(version: str) -> tuple[int, int]:
    """``"2.11.0+cu130"`` -> ``(2, 11)``; ``"2.13"`` -> ``(2, 13)``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def shape(version: str) -> Shape:
    """The key set of torch ``version``'s ``memory_stats()`` (any release from 1.13 on)."""
    arrays, scalars, pools = list(BASE_ARRAYS), list(BASE_SCALARS), False
    for since, more_arrays, more_scalars, more_pools in ADDED:
        if release(version) >= since:
            arrays += more_arrays
            scalars += more_scalars
            pools = pools or more_pools
    return Shape(tuple(arrays), tuple(scalars), pools)


# The two key sets the SYNTHETIC fixtures are written in.
STAT_ARRAYS: dict[str, tuple[str, ...]] = {v: shape(v).arrays for v in ("1.13", "2.13")}
SCALARS: dict[str, tuple[str, ...]] = {v: shape(v).scalars for v in ("1.13", "2.13")}

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
    keys = shape(version)
    unknown = set(arrays) - set(keys.arrays) | set(scalars) - set(keys.scalars)
    if unknown or (private_pools and not keys.private_pools):
        raise ValueError(f"torch {version} reports no {sorted(unknown) or PRIVATE_POOLS}")
    out: dict[Any, Any] = {name: scalars.get(name, 0) for name in keys.scalars}
    out.update({name: arrays.get(name, array()) for name in keys.arrays})
    out.update({name: stat() for name in SINGLE_STATS})
    if keys.private_pools:
        out[PRIVATE_POOLS] = dict(private_pools or {})
    return out


def reported(flat: dict[str, int], version: str) -> dict[str, int]:
    """What torch ``version`` answers of a fixture's flat answer: the keys that release reports.

    A fixture of an older torch keeps its smaller set (the figures it has are all there is); one of a
    newer torch loses the keys that release never had (torch 2.11 has no ``num_oom_rejections`` and
    no private pools)."""
    known = set(flatten(nested(version, {}, {})))
    pools = shape(version).private_pools
    return {k: v for k, v in flat.items() if k in known or (pools and k.startswith(PRIVATE_POOLS + "."))}


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
