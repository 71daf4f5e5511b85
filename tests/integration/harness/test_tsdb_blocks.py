"""A TSDB block written by tests/support/tsdb_blocks.py reads back through promtool as written."""

from __future__ import annotations

import math
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.binaries import require
from tests.support.ranksim import Trajectory
from tests.support.tsdb_blocks import Labels, Model, write_block
from tests.support.tsdb_chunks import constant_chunk, crc32c, xor_chunk

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Noise:
    """Values that exercise every XOR case: equal, new window, reused window, +-Inf, tiny, huge."""

    seed: int

    def at(self, t: float) -> float:
        return random.Random(f"{self.seed}-{t}").choice([0.0, 1.5, -3e9, math.inf, -math.inf, 1e-300, 12345.678, t])

    def constant(self, t0: float, t1: float) -> float | None:
        return None


def test_crc32c_is_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


def test_the_constant_shortcut_is_the_encoder() -> None:
    ts = [1_700_000_000_000 + 15_000 * i for i in range(120)]
    for v in (0.0, 3.3e10, math.inf):
        for n in (2, 3, 9, 120):
            assert constant_chunk(ts[0], 15_000, n, v) == xor_chunk(ts[:n], [v] * n)


def test_a_block_reads_back_through_promtool(tmp_path: Path) -> None:
    start = 1_700_000_000_000
    rng = random.Random(7)
    # A fixed step, with jitter, gaps and a jump: every delta-of-delta width of the encoder.
    ts = [
        start
        + 15_000 * i
        + (rng.randint(-3000, 3000) if i % 7 == 0 else 0)
        + (10**6 if i >= 100 else 0)
        + (10**9 if i > 200 else 0)
        for i in range(250)
    ]
    models = {
        "const": Trajectory(2.5),
        "ramp": Trajectory(3.3e10, start / 1000 + 600, 3.3e10, 4.2e6),
        "steps": Trajectory(0.0, start / 1000, 0.0, 1.0, 1.0),
        "inf": Trajectory(math.inf),
    }
    series: list[tuple[Labels, Model]] = [
        ((("__name__", f"m_{kind}"), ("rank", str(r))), model) for r in range(3) for kind, model in models.items()
    ]
    series += [((("__name__", "m_noise"), ("rank", str(r)), ("device", "cuda:0")), Noise(r)) for r in range(3)]
    write_block(tmp_path, series, ts)
    (tmp_path / "wal").mkdir()
    dump = subprocess.run(
        [require("promtool"), "tsdb", "dump", str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    got: dict[str, list[tuple[float, int]]] = {}
    for line in dump.splitlines():
        labels, value, at = line.rsplit(" ", 2)
        got.setdefault(labels, []).append((float(value), int(at)))
    want = {
        "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels)) + "}": [(m.at(t / 1000), t) for t in ts]
        for labels, m in series
    }
    assert got == want
    analyze = subprocess.run(
        [require("promtool"), "tsdb", "analyze", str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "Series: 15" in analyze
