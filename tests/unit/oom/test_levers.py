"""oom/levers.py: each lever's arithmetic over hand-made rows, and the ranking (issue 44)."""

from __future__ import annotations

import math

import pytest

from memexporter.oom import levers
from memexporter.oom.advice import Advice
from memexporter.oom.capacity import Capacity
from memexporter.oom.peakfit import Fit
from memexporter.tracking.snapshots import Layout, Snapshot
from memexporter.units import MiB

# (root) embed blocks blocks.0 blocks.0.attn blocks.1 blocks.1.attn head
NAMES = ("(root)", "embed", "blocks", "blocks.0", "blocks.0.attn", "blocks.1", "blocks.1.attn", "head")
PARENTS = (-1, 0, 0, 2, 3, 2, 5, 0)
CLASSES = ("GPT", "Embedding", "ModuleList", "Block", "Attention", "Block", "Attention", "Linear")


def snap(**kw: object) -> Snapshot:
    zeros = (0,) * len(NAMES)
    fields: dict[str, object] = {
        "layout": Layout(NAMES, PARENTS, CLASSES, frozenset({3, 5})),
        "max_modules": 100,
        "parameter": zeros,
        "gradient": zeros,
        "optimizer_state": zeros,
        "activation": zeros,
    }
    fields.update(kw)
    return Snapshot(**fields)  # type: ignore[arg-type]


def test_checkpointing_frees_the_blocks_saves_less_inputs_and_one_recompute() -> None:
    # Each block saves 10 (own 4 + its attention's 6) of which 2 is its input; the head saves 3 after them.
    s = snap(activation=(0, 1, 0, 4, 6, 4, 6, 3), inputs=(0, 0, 0, 2, 0, 2, 0, 0))
    lever = levers.checkpointing(s, "cuda:0")
    assert lever is not None
    assert lever.action.startswith("checkpoint blocks.* (2 x Block")
    # saved 20, inputs 4, recompute 10 - 2 = 8 of which 3 is freed by then (the head's): 20 - 4 - 5
    assert lever.freed_bytes == 11


def test_checkpointing_needs_repeated_blocks_with_saves() -> None:
    assert levers.checkpointing(snap(), "cpu") is None  # nothing saved yet
    flat = Snapshot(
        Layout(("(root)", "a", "b"), (-1, 0, 0), ("M", "L", "L")), 10, (0,) * 3, (0,) * 3, (0,) * 3, (1,) * 3
    )
    assert levers.checkpointing(flat, "cpu") is None  # named siblings are not numbered blocks


@pytest.mark.parametrize(
    ("world", "placement", "unsharded", "freed", "words"),
    [
        (4, (), None, 300.0, "shard the optimizer state over the 4 ranks"),
        (2, (), None, 200.0, "over the 2 ranks"),
        (1, (), None, None, None),
        (2, (("optimizer_state", "cuda:0", (400,) + (0,) * 7),), None, 0.0, "already sharded (DeepSpeed ZeRO)"),
        (2, (), (0,) * 8, 0.0, "already sharded (FSDP2 / DTensor)"),
    ],
)
def test_sharding_the_optimizer_rows(
    world: int, placement: tuple, unsharded: tuple | None, freed: float | None, words: str | None
) -> None:
    s = snap(optimizer_state=(0, 100, 0, 100, 100, 100, 0, 0), placement=placement, unsharded=unsharded)
    lever = levers.sharding(s, world, "cuda:0")
    if freed is None:
        assert lever is None
        return
    assert lever is not None and lever.freed_bytes == pytest.approx(freed)
    assert words in lever.action


def test_precision_halves_the_float32_parameters_and_their_gradients() -> None:
    # embed: 100 fp32 of 100 (grad 100); head: 50 fp32 of 100 (grad 100, half of it fp32)
    s = snap(
        parameter=(0, 100, 0, 0, 0, 0, 0, 100),
        parameter_fp32=(0, 100, 0, 0, 0, 0, 0, 50),
        gradient=(0, 100, 0, 0, 0, 0, 0, 100),
    )
    lever = levers.precision(s, "cpu")
    assert lever is not None and lever.freed_bytes == (100 + 100 + 50 + 50) / 2
    assert levers.precision(snap(parameter=(1,) * 8, parameter_fp32=(0,) * 8), "cpu") is None  # bf16 already


def test_leak_says_how_much_longer_the_job_runs_once_fixed() -> None:
    # 10 MiB/step at 1 step/s, 100 MiB to go: ETA 10 s now. The holder grows 8 of the 10.
    lever = levers.leak("cuda:0", "Runner.cache (list)", 40 * MiB, 8 * MiB, (10 * MiB, 10 * MiB, 100 * MiB, 10.0))
    assert lever.freed_bytes == 40 * MiB
    assert "fix the leak held by Runner.cache (list)" in lever.action
    assert "OOM ETA 10 s now; once fixed ~1 m)" in lever.action  # (100 + 40) / 2 MiB per step: 70 s
    whole = levers.leak("cpu", "x", 1.0, 10 * MiB, (10 * MiB, 10 * MiB, 100 * MiB, 10.0))
    assert "the job runs on" in whole.action


def cap(elements: float = 1000.0) -> Capacity:
    fit = Fit(constant=1000.0, linear=4.0, quadratic=0.0, points=8, sigma=0.0, max_residual=0.0, spread=0.0)
    return Capacity("cuda:0", elements, 4.0, 1200, 120, 10, None, 5000.0, fit)


def test_input_lever_frees_the_peak_above_what_fits() -> None:
    lever = levers.input_lever(cap())
    assert lever.freed_bytes == pytest.approx(4.0 * 200)  # the largest seen, 1200, down to 1000
    assert lever.capacity_elements == 1000.0
    assert lever.describe().startswith("input: the largest input that fits: 1,000 elements")
    assert ": frees ~800.0 B at the step peak; the input then fits up to 1,000 elements" in lever.describe()


def test_ranked_largest_first_with_the_capacity_each_leaves() -> None:
    fixed = levers.Lever("stranded", "cuda:0", "set it", 400.0, "b")
    scaling = levers.Lever("checkpointing", "cuda:0", "checkpoint", 1200.0, "b")  # at 1200 elements: 1 B/element
    unknown = levers.Lever("precision", "cuda:0", "needs rows", None, levers.TRACK)
    got = levers.ranked([unknown, fixed, scaling], cap())
    assert [v.kind for v in got] == ["checkpointing", "stranded", "precision"]
    assert got[0].capacity_elements == pytest.approx(4000 / 3)  # slope 4 -> 3 bytes per element
    assert got[1].capacity_elements == pytest.approx(1100)  # 400 B more at 4 B per element
    assert got[2].capacity_elements is None and got[2].describe().endswith(levers.TRACK)
    assert "; the input then fits up to 1,333 elements (estimate: b)" in got[0].describe()
    assert got[0].to_json()["estimate"] is True and math.isclose(got[0].to_json()["freed_bytes"], 1200.0)


def test_stranded_is_the_advice() -> None:
    lever = levers.stranded(Advice("cuda:0", 3 * MiB, 10 * MiB))
    assert lever.freed_bytes == 3 * MiB and "expandable_segments:True" in lever.action
