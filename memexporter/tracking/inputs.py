"""The step's input, measured on the training thread: its size, and the points the capacity is fitted on.

What a step was given is read from shapes only (no device sync, no copy, no data read):

- ``elements``: the elements of every tensor among the arguments, one level into tuples, lists and
  dicts (the HF Trainer calls ``model(**batch)`` with ``input_ids``, ``attention_mask``, ``labels``);
- ``length``: dimension 1 of the largest tensor with 2 or more dimensions (the sequence), and
  ``batch``: its dimension 0.

Two sources: the tracked model's entry forward (``forward.py`` calls ``note_call`` from its pre-hook,
outermost forwards only), and ``memexporter.step_input()`` for a loop without a tracked model (the
Lightning callback calls it with its batch). A step's input is the largest noted in it: with gradient
accumulation, the largest micro-batch sets the peak.

At each boundary ``StepTracker.step`` closes the step (``end_step``) and, for each device, hands
``add`` the step's excursion (its peak above its start, bytes) when that peak was measured: exact
(the high-water mark rose) or sampled (a detailed step's highest sample). Steps whose peak is an
estimate carry no input information and are left out. Points are binned by input size (bins 5 %
apart, ``BIN_POINTS`` recent points each, at most ``MAX_BINS`` bins, the least recently used
evicted): bounded, and a rare long batch is kept as long as a common short one.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

from memexporter.oom.capacity import InputPoints, InputSnapshot

__all__ = ["InputLog", "InputPoints", "InputSnapshot", "measure", "note_call"]

BIN_RATIO = 1.05
BIN_POINTS = 8
MAX_BINS = 128
"""At most 1 024 points a device (24 bytes each in Python tuples: ~100 KiB), whatever the run's length."""
MIN_RISE = 1 << 20
"""A detailed step's sample is a point only 1 MiB above the step's ends (see ``measured``)."""
MAX_ITEMS = 32
"""Items looked at in one container (a list of images): the hook's cost stays bounded."""

_Tensor: Any = None  # torch._C.TensorBase, on the first measure: importing memexporter needs no torch


def _tensor_base() -> Any:
    global _Tensor
    import torch

    _Tensor = torch._C.TensorBase  # every tensor (Parameter, subclasses) derives from it
    return _Tensor


def measure(args: Iterable[Any], kwargs: dict[str, Any] | None = None) -> tuple[int, int, int]:
    """``(elements, length, batch)`` of a call's arguments (module docstring); length and batch 0
    when no tensor has 2 dimensions. Written for the hook's budget: ``isinstance`` against the C base
    class (``torch.Tensor``'s metaclass check costs several times more), ``ndim`` and ``shape``."""
    base = _Tensor or _tensor_base()
    elements = top = batch = length = 0
    for group in (args, kwargs.values()) if kwargs else (args,):
        for n, v in enumerate(group):
            if n >= MAX_ITEMS:
                break
            if isinstance(v, base):
                items: Iterable[Any] = (v,)
            elif isinstance(v, (tuple, list)):
                items = v
            elif isinstance(v, dict):
                items = v.values()
            else:
                continue
            for k, t in enumerate(items):
                if k >= MAX_ITEMS:
                    break
                if isinstance(t, base):
                    e = t.numel()
                    elements += e
                    if e > top and t.ndim >= 2:
                        shape = t.shape
                        top, batch, length = e, shape[0], shape[1]
    return elements, length, batch


class InputLog:
    """Bounded input state of one step tracker. ``note`` is the hot path (the training thread)."""

    def __init__(self, skip_steps: int = 2) -> None:
        """``skip_steps``: the first steps' points are left out (the optimizer's state and the
        allocator's caches are created in them, inside the excursion)."""
        self.elements = self.length = self.batch = 0  # the open step's largest input so far
        self.last = 0  # the last completed step's elements
        self.largest = (0, 0, 0)  # the largest completed step's (elements, length, batch)
        self.before = 0  # the largest before it
        self._skip = skip_steps
        self._steps = 0
        self._lock = threading.Lock()
        self._bins: dict[str, dict[int, deque[tuple[int, int, float, int, int]]]] = {}

    def note(self, elements: int, length: int, batch: int) -> None:
        """The step was given an input of this size (keeps the largest of the step)."""
        if elements > self.elements:
            self.elements, self.length, self.batch = elements, length, batch

    def end_step(self) -> tuple[int, int] | None:
        """Close the open step: its ``(elements, length)`` when its points count, else None."""
        elements, length = self.elements, self.length
        self._steps += 1
        if not elements:
            return None
        if elements > self.largest[0]:
            self.before, self.largest = self.largest[0], (elements, length, self.batch)
        self.last, self.elements, self.length, self.batch = elements, 0, 0, 0
        return (elements, length) if self._steps > self._skip else None

    def measured(self, device: str, size: tuple[int, int], step: int, ends: int, top: int, exact: bool) -> None:
        """A step of ``device`` given the input ``size`` (from ``end_step``) ended: ``top`` is its peak
        (bytes) when ``exact`` (the high-water mark rose), else its highest sample (0: none taken).
        A sample counts only ``MIN_RISE`` above the step's ends (``ends``, bytes): on the host, freed
        memory stays resident and a sample says nothing of the step's own peak."""
        if exact or top > ends + MIN_RISE:
            self.add(device, size, step, float(top), exact)

    def add(self, device: str, size: tuple[int, int], step: int, peak: float, exact: bool) -> None:
        """One measured point of ``device``: ``peak`` bytes at ``step`` for the input ``size``."""
        key = int(math.log(max(size[0], 1)) / math.log(BIN_RATIO))
        with self._lock:
            bins = self._bins.setdefault(device, {})
            got = bins.pop(key, None)  # re-inserted last: the dict's order is the recency
            if got is None:
                got = deque(maxlen=BIN_POINTS)
                if len(bins) >= MAX_BINS:
                    del bins[next(iter(bins))]
            got.append((size[0], size[1], peak, step, int(exact)))
            bins[key] = got

    def forget(self, device: str) -> None:
        """Drop ``device``'s points: its trend restarted at a new level, and the peaks measured before it
        would read as an input that no longer fits (the step tracker calls it)."""
        with self._lock:
            self._bins.pop(device, None)

    def snapshot(self) -> InputSnapshot:
        with self._lock:
            devices = {}
            for device, bins in self._bins.items():
                rows = [row for points in bins.values() for row in points]
                devices[device] = InputPoints(
                    tuple(float(r[0]) for r in rows),
                    tuple(float(r[1]) for r in rows),
                    tuple(r[2] for r in rows),
                    tuple(r[3] for r in rows),
                    tuple(r[4] for r in rows),
                )
        largest = self.largest
        return InputSnapshot(self.last, largest[0], largest[1], largest[2], self.before, devices)

    def in_flight(self) -> tuple[int, int]:
        """``(elements of the open step, the largest completed before it)``: what an OOM now was given."""
        return self.elements, self.largest[0]


# --- The process's log (the exporter's tracker's), for the hooks and ``memexporter.step_input``. ---

_active: InputLog | None = None


def activate(log: InputLog | None) -> None:
    global _active
    _active = log


def active() -> InputLog | None:
    return _active


def note_call(args: Any, kwargs: dict[str, Any] | None) -> None:
    """Measure a forward's arguments into the active log (the entry pre-hook). Never raises. One
    positional tensor (a plain loop's ``model(x)``) takes a short path: this runs at every step."""
    log = _active
    if log is None:
        return
    try:
        if not kwargs and len(args) == 1 and isinstance(v := args[0], _Tensor or _tensor_base()):
            e = v.numel()
            if e > log.elements:
                shape = v.shape if v.ndim >= 2 else (0, 0)
                log.elements, log.length, log.batch = e, shape[1], shape[0]
            return
        log.note(*measure(args, kwargs))
    except Exception:
        from memexporter.tracking.errors import count_failure

        count_failure("input measurement")
