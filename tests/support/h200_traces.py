"""The H200's per-step allocator traces (tests/fixtures/recorded/traces/), as data.

Two kinds, each ``torch.cuda.memory_stats()`` after every step of a job into a real ``OutOfMemoryError``
on an NVIDIA H200 (torch 2.11); ``columns`` names each row's fields, ``oom`` is the error's first line:

- leak traces (``leak_mib_per_step`` > 0; 2026-11-27, ``tests/cuda/record_traces.py``): a job
  (6 x Linear(1024), AdamW, ~30 steps/s) leaking 8 MiB (or 32 MiB) a step under a 6 GiB
  ``set_per_process_memory_fraction``, once per allocator backend; no exporter was running.
- the lengths trace (``trace-lengths-native``; 2026-11-28, ``tests/cuda/record_lengths.py``): a GPT
  trained at lengths 64 to 512 at batch 8, then a 2.45 GiB fraction, then lengths growing 1.25x a
  step until the OOM; its rows add the step's input (``replay.INPUT_COLUMNS``) and ``exporter``
  holds what the exporter watching it said (its capacity before the long batches, the longest input
  that ran and the one that died).

No torch here: the promtool scenario generator reads them too (``trace_scenarios.py``).
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import REPO_ROOT

RECORDED = REPO_ROOT / "tests" / "fixtures" / "recorded"
TRACES = RECORDED / "traces"


@dataclass(frozen=True)
class Trace:
    """One recorded trace: ``rows`` of ``{column: value}`` (``t`` seconds, ``step``, memory_stats keys);
    ``exporter``: what the exporter watching it recorded (empty when none ran)."""

    name: str
    alloc_conf: str
    limit: int
    leak_mib: int
    rows: list[dict[str, float]]
    oom: str
    exporter: dict[str, Any] = field(default_factory=dict)

    @property
    def leaks(self) -> bool:
        """A leak trace (its job leaked ``leak_mib`` a step into the OOM), not the lengths trace."""
        return self.leak_mib > 0

    @property
    def limit_from_step(self) -> int:
        """The first row run under ``limit``; the rows before it ran under the device's whole memory.
        ``record_lengths.py`` sets the fraction after its training steps and names that row
        (``exporter.limit_from_step``); 2026-11-28's trace came before the field, at the recorder's
        default ``--train-steps`` (300: ``gpu-check.sh`` passes none), which its pacing confirms
        (``tests/unit/oom/test_capacity.py``). A leak trace ran under its limit throughout."""
        if self.leaks:
            return 0
        return int(self.exporter.get("limit_from_step", 300))

    @property
    def backend(self) -> str:
        return "cudaMallocAsync" if "cudaMallocAsync" in self.alloc_conf else "native"

    @property
    def oom_at(self) -> float:
        """When the OOM came (trace seconds): one median step after the last row, the step that died."""
        times = [r["t"] for r in self.rows]
        return times[-1] + statistics.median(b - a for a, b in itertools.pairwise(times))


def load_trace(name: str) -> Trace:
    """``trace-native-8mib`` (or a path) -> its ``Trace``."""
    path = Path(name) if name.endswith(".json") else TRACES / f"{name}.json"
    doc = json.loads(path.read_text())
    rows = [dict(zip(doc["columns"], row, strict=True)) for row in doc["rows"]]
    leak = int(doc["leak_mib_per_step"])
    return Trace(path.stem, doc["alloc_conf"], int(doc["limit_bytes"]), leak, rows, doc["oom"], doc.get("exporter", {}))


def trace_names() -> list[str]:
    """Every committed trace, of both kinds (``Trace.leaks`` tells them apart)."""
    return sorted(p.stem for p in TRACES.glob("trace-*.json"))
