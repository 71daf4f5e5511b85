"""The live page's data, ``/live.json``: the job's memory in a browser, no Prometheus needed.

Rendered in the job from the same collection of the registry as ``/metrics`` (``render.py``: one
collection, two bodies, published together), so every figure on the page is a ``/metrics`` sample of
that moment: per device used, limit, step peak, baseline, leak rate and OOM ETA (with the ETA in words),
the largest input that fits (``oom.capacity.in_words``, from the input series), the module rows
(largest first), each collector's health, and the top three levers of what would fit
(``collectors/levers.py``, gathered beside the collection: estimates, each with its basis). The history of the last half hour comes
from the in-process ``History`` (step baselines and peaks), not from Prometheus. The page itself is the
helper's (``serving/page.py``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.metrics_core import Metric

from memexporter.oom.advice import Advice
from memexporter.oom.capacity import NEAR
from memexporter.oom.capacity import in_words as capacity_in_words
from memexporter.tracking.history import History
from memexporter.units import fmt_bytes, fmt_duration

TOP_MODULES = 15
TOP_LEVERS = 3
_DEVICE = (
    "memory_used_bytes",
    "memory_committed_bytes",
    "memory_limit_bytes",
    "memory_peak_bytes",
    "memory_committed_peak_bytes",
    "allocator_recoverable_bytes",
    "memory_baseline_bytes",
    "leak_rate_bytes_per_second",
    "leak_bytes_per_step",
    "oom_eta_seconds",
    "input_capacity_elements",
)
# The rank's input figures (oom/capacity.py reads them back into one line per device).
_INPUT = (
    "step_input_elements_max",
    "step_input_max_length",
    "step_input_max_batch",
    "input_declared_max_elements",
)
_MODULE = {
    "parameters": "module_parameter_bytes",
    "gradients": "module_gradient_bytes",
    "optimizer_state": "module_optimizer_state_bytes",
    "activations": "module_activation_bytes",
}


def in_words(device: Mapping[str, float | None]) -> str:
    """What the leak rate and the ETA mean, in a sentence."""
    rate, eta = device.get("leak_rate_bytes_per_second"), device.get("oom_eta_seconds")
    if rate is None or eta is None:
        return "not enough steps yet to tell whether memory grows"
    if rate <= 0 or not math.isfinite(eta):
        return "memory held between steps is not growing"
    per_step = device.get("leak_bytes_per_step")
    pace = f"{fmt_bytes(rate)}/s" + (f" ({fmt_bytes(per_step)} per step)" if per_step else "")
    return f"memory held between steps grows {pace}; at this rate the peak reaches the limit in {fmt_duration(eta)}"


def advice_in_words(device: str, figures: Mapping[str, float | None]) -> str | None:
    """The remedy for stranded memory, when ``allocator_recoverable_bytes`` names some (``oom.advice``)."""
    recoverable, limit = figures.get("allocator_recoverable_bytes"), figures.get("memory_limit_bytes")
    if not recoverable or not limit:
        return None
    return Advice(device, recoverable, limit).describe()


def input_in_words(figures: Mapping[str, float | None], rank: Mapping[str, float]) -> tuple[str | None, bool]:
    """The device's largest input that fits, in a line, and whether it warns (``oom.capacity.in_words``)."""
    capacity, largest = figures.get("input_capacity_elements"), rank.get("step_input_elements_max")
    if capacity is None or not largest:
        return None, False
    declared = rank.get("input_declared_max_elements")
    line = capacity_in_words(
        capacity, largest, rank.get("step_input_max_length", 0.0), rank.get("step_input_max_batch", 0.0), declared
    )
    return line, (declared is not None and declared > capacity) or largest >= (1 - NEAR) * capacity


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None  # JSON has no Inf or NaN: null, and in_words says what it meant


def document(
    samples: Iterable[tuple[str, dict[str, str], float]],
    history: History | None,
    levers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The page's data from one collection of the registry: ``(name, labels, value)`` samples; ``levers``:
    what would fit (``Lever.to_json``), largest first, of which the page shows ``TOP_LEVERS``."""
    devices: dict[str, dict[str, float | None]] = defaultdict(dict)
    modules: dict[str, dict[str, float]] = defaultdict(dict)
    health: dict[str, bool] = {}
    inputs: dict[str, float] = {}
    doc: dict[str, Any] = {"rank": None, "steps": None, "step_interval_seconds": None}
    by_module = {f"memexporter_{v}": k for k, v in _MODULE.items()}
    for name, labels, value in samples:
        short = name.removeprefix("memexporter_")
        doc["rank"] = doc["rank"] or labels.get("rank")
        if short in _DEVICE and "device" in labels:
            devices[labels["device"]][short] = value
        elif name in by_module and "module" in labels:
            modules[labels["module"]][by_module[name]] = value
        elif short in _INPUT:
            inputs[short] = value
        elif short == "collector_success":
            health[labels.get("collector", "?")] = value == 1
        elif short == "steps_total":
            doc["steps"] = int(value)
        elif short == "step_interval_seconds":
            doc["step_interval_seconds"] = value
    points = history.points() if history is not None else []
    doc["devices"] = [
        {
            "device": dev,
            **{k: _finite(v) for k, v in figures.items() if v is not None},
            "in_words": in_words(figures),
            "advice": advice_in_words(dev, figures),
            **dict(zip(("input", "input_warn"), input_in_words(figures, inputs), strict=True)),
            "history": [[p.time, *p.devices[dev]] for p in points if dev in p.devices],
        }
        for dev, figures in sorted(devices.items(), key=lambda kv: (kv[0] == "cpu", kv[0]))
    ]
    rows = sorted(modules.items(), key=lambda kv: -sum(kv[1].values()))
    doc["modules"] = [{"module": m, **figures} for m, figures in rows[:TOP_MODULES]]
    doc["modules_left_out"] = max(0, len(rows) - TOP_MODULES)
    doc["health"] = health
    doc["levers"] = (levers or [])[:TOP_LEVERS]
    return doc


def encode(families: Iterable[Metric], history: History | None, levers: list[dict[str, Any]] | None = None) -> bytes:
    """The page's JSON document from one collection of the registry (and the levers gathered beside it)."""
    samples = ((s.name, s.labels, s.value) for family in families for s in family.samples)
    return json.dumps(document(samples, history, levers), separators=(",", ":"), allow_nan=False).encode()
