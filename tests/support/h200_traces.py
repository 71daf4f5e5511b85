"""The H200's per-step allocator traces (tests/fixtures/recorded/traces/), as data.

Recorded on an NVIDIA H200 (torch 2.11, 2026-11-27): ``torch.cuda.memory_stats()`` after every step
of a job (6 x Linear(1024), AdamW, ~30 steps/s) leaking 8 MiB (or 32 MiB) a step into a real
``OutOfMemoryError`` under a 6 GiB ``set_per_process_memory_fraction``, once per allocator backend.
``columns`` names each row's fields; ``oom`` is the error's first line; no exporter was running.
No torch here: the promtool scenario generator reads them too (``trace_scenarios.py``).
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO_ROOT

RECORDED = REPO_ROOT / "tests" / "fixtures" / "recorded"
TRACES = RECORDED / "traces"


@dataclass(frozen=True)
class Trace:
    """One recorded trace: ``rows`` of ``{column: value}`` (``t`` seconds, ``step``, memory_stats keys)."""

    name: str
    alloc_conf: str
    limit: int
    leak_mib: int
    rows: list[dict[str, float]]
    oom: str

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
    return Trace(path.stem, doc["alloc_conf"], int(doc["limit_bytes"]), int(doc["leak_mib_per_step"]), rows, doc["oom"])


def trace_names() -> list[str]:
    return sorted(p.stem for p in TRACES.glob("trace-*.json"))
