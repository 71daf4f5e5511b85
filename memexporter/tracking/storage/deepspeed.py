"""Storage rules of DeepSpeed: ZeRO-3's parameter partitions, the engine's steps, and the version check.

DeepSpeed 0.19 (``deepspeed/runtime/zero/``, ``deepspeed/utils/tensor_fragment.py``) marks what
each rank holds on the parameters themselves, and these rules read only those marks, never
DeepSpeed's modules (importing memexporter never imports DeepSpeed):

- ZeRO-3 empties a parameter's ``data`` (``numel() == 0``) and keeps this rank's partition in
  ``param.ds_tensor`` (padding included; on the host under ``offload_param``), the whole size in
  ``param.ds_numel``. The test is the one DeepSpeed's public accessors make (``hasattr(param, 'ds_id')``).
- ZeRO 1 and 2 keep whole parameters; their flat partitions are read in ``zero.py``.
- ``DeepSpeedEngine._take_model_step`` steps DeepSpeed's optimizer, which steps its inner torch
  optimizer once per parameter group, then adds one to ``engine.global_steps``: the step count.

Those are private structures. The minors tested are in ``TESTED``; another one is read the same
way after one log line, and where a structure differs the rows it feeds are left out, the reason is
logged once (``absent``) and the modules collector's ``memexporter_collector_success`` reads 0.
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing memexporter needs no torch (tests/integration/test_without_torch.py)
    import torch

__all__ = ["TESTED", "Unsupported", "absent", "checked", "engine_of", "engine_step", "loaded", "partition"]

log = logging.getLogger("memexporter")

TESTED = ((0, 19),)
"""DeepSpeed minors whose ZeRO structures these rules were tested against (tests/integration/frameworks/test_deepspeed_*.py)."""

_FRAMES = 16  # how far up the stack an optimizer step's post-hook looks for the engine's _take_model_step
_engines: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # optimizer -> engine ref or None
_logged: set[str] = set()


class Unsupported(Exception):
    """DeepSpeed's structures are not what these rules read: the message says what differs."""


def loaded() -> bool:
    """DeepSpeed is imported in this process (nothing here imports it)."""
    return "deepspeed" in sys.modules


def checked() -> str | None:
    """DeepSpeed's version; logs once when its minor is not in ``TESTED``. None if not imported."""
    ds = sys.modules.get("deepspeed")
    if ds is None:
        return None
    version = str(getattr(ds, "__version__", "?"))
    try:
        minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        minor = ()
    if minor not in TESTED and version not in _logged:
        _logged.add(version)
        log.warning(
            "memexporter: DeepSpeed %s is not a tested version (%s); its ZeRO partitions are read as 0.19 "
            "lays them out, and rows whose structures differ are left out",
            version,
            ", ".join(f"{a}.{b}" for a, b in TESTED),
        )
    return version


def absent(reason: str) -> str:
    """Log once why DeepSpeed rows are left out; returns the reason (for the collector's health)."""
    if reason not in _logged:
        _logged.add(reason)
        log.warning("memexporter: DeepSpeed %s: %s; those module rows are left out", checked() or "?", reason)
    return reason


def partition(p: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``(this rank's partition, unsharded bytes)`` of a ZeRO-3 parameter, None for any other.

    ``ds_tensor`` holds this rank's elements (its share of the padding included);
    ``ds_numel`` elements of ``ds_tensor``'s type make the whole parameter."""
    if not hasattr(p, "ds_id"):
        return None
    import torch

    shard = getattr(p, "ds_tensor", None)
    if not isinstance(shard, torch.Tensor):
        raise Unsupported("a ZeRO-3 parameter has no ds_tensor")
    return shard, int(p.ds_numel) * shard.element_size()  # type: ignore[attr-defined]


def engine_of(optimizer: object) -> Any | None:
    """The DeepSpeed engine stepping ``optimizer`` (its inner torch optimizer, or the one it was
    given), None when ``optimizer`` is not stepped by an engine. Call it from an optimizer step
    hook only: the engine is found once per optimizer, in the frames above the hook
    (``_take_model_step``'s ``self``), and kept by weak reference."""
    if not loaded():
        return None
    try:
        ref = _engines[optimizer]
    except KeyError:
        ref = _find_engine()
        _engines[optimizer] = ref
    except TypeError:  # not weak-referenceable
        return None
    return ref() if ref is not None else None


def engine_step(optimizer: object) -> int | None:
    """The step a DeepSpeed engine is taking when it steps ``optimizer`` (``global_steps + 1``:
    every parameter group's step of one engine step gives the same number); None outside an engine."""
    steps = getattr(engine_of(optimizer), "global_steps", None)
    return steps + 1 if isinstance(steps, int) else None


def _find_engine() -> weakref.ref[Any] | None:
    frame = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame.f_code.co_name == "_take_model_step":
            engine = frame.f_locals.get("self")
            if hasattr(engine, "global_steps"):
                checked()
                return weakref.ref(engine)
        if frame.f_back is None:
            return None
        frame = frame.f_back
    return None
