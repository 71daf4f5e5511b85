"""`max_fit`: the measured answer, and when a line through the peaks is trusted to predict one."""

from __future__ import annotations

import pytest

from memexporter.sweep.fit import fit_line, max_fit
from memexporter.sweep.grid import parse_grid
from memexporter.sweep.runner import MiB, Run, Sweep


def sweep(
    specs: list[str],
    peaks: dict[tuple[str, ...], float | None],
    limit_mib: float | None = 1000,
    ooms: tuple[tuple[str, ...], ...] = (),
) -> Sweep:
    """A sweep whose runs have the given peaks (MiB); a run in ``ooms`` ran out of memory."""
    axes = parse_grid(specs)
    s = Sweep(axes, ["train.py"], 10, limit_mib)
    for key, peak in peaks.items():
        params = dict(zip([a.name for a in axes], key, strict=True))
        oom = key in ooms or (peak is not None and limit_mib is not None and peak > limit_mib)
        s.runs.append(
            Run(
                params,
                status="oom" if oom else "ok",
                peak_bytes=None if peak is None else peak * MiB,
                oom=oom,
                fits=not oom,
                limit_bytes=None if limit_mib is None else limit_mib * MiB,
            )
        )
    return s


def test_a_line_predicts_the_largest_integer_that_fits() -> None:
    # 200 MiB + 100 MiB per unit: the limit 1000 MiB is reached at 8.0; 8 fits (on the limit), 9 does not.
    s = sweep(["batch=1,2,4,16"], {("1",): 300, ("2",): 400, ("4",): 600, ("16",): 1800})
    mf = max_fit(s)
    assert mf.measured == {"batch": "4"}
    assert mf.predicted.value == 8 and mf.predicted.reason is None
    assert mf.predicted.line is not None
    assert mf.predicted.line.slope == pytest.approx(100 * MiB) and mf.predicted.line.intercept == pytest.approx(
        200 * MiB
    )


def test_a_float_axis_is_not_rounded() -> None:
    s = sweep(["scale=0.5,1,1.5"], {("0.5",): 250, ("1",): 300, ("1.5",): 350}, limit_mib=375)
    assert max_fit(s).predicted.value == pytest.approx(1.75)


@pytest.mark.parametrize(
    ("specs", "peaks", "limit", "reason"),
    [
        # seq² attention: a line through 1, 2, 4 overshoots what would really fit.
        (
            ["seq=1,2,4"],
            {("1",): 101, ("2",): 104, ("4",): 116},
            140,
            "the peak is not linear in seq: a run is 1.3 MiB off the line",
        ),
        (["batch=1,2"], {("1",): 300, ("2",): 400}, 1000, "2 run(s) fit; a fit needs 3"),
        (["batch=1,2,3"], {("1",): 300, ("2",): 300, ("3",): 299.99}, 1000, "the peak does not grow with batch"),
        (
            ["batch=1,2,3"],
            {("1",): 300, ("2",): 310, ("3",): 320},
            1000,
            "the line reaches the limit at batch=71, beyond 6",
        ),
        (["opt=sgd,adam,lamb"], {("sgd",): 1, ("adam",): 2, ("lamb",): 3}, 1000, "the first axis, opt, is not numeric"),
        (["batch=1,2,3"], {("1",): 300, ("2",): 400, ("3",): 500}, None, "no limit is known"),
    ],
)
def test_unsound_fits_predict_nothing_and_say_why(
    specs: list[str], peaks: dict[tuple[str, ...], float], limit: float | None, reason: str
) -> None:
    mf = max_fit(sweep(specs, peaks, limit))
    assert mf.predicted.value is None
    assert mf.predicted.reason is not None and mf.predicted.reason.startswith(reason), mf.predicted.reason


def test_a_prediction_that_a_measurement_contradicts_is_dropped() -> None:
    # The line says 5 fits, but 4 ran out of memory (a caught OOM early in its first step: low peak).
    s = sweep(["batch=1,2,3,4"], {("1",): 300, ("2",): 400, ("3",): 500, ("4",): 350}, limit_mib=750, ooms=(("4",),))
    mf = max_fit(s)
    assert mf.measured == {"batch": "3"}
    assert mf.predicted.value is None
    assert mf.predicted.reason == "the line says batch=5 fits, but batch=4 ran out of memory"


def test_each_other_axis_value_gets_its_own_line() -> None:
    peaks: dict[tuple[str, ...], float | None] = {}
    for seq, per in (("64", 10.0), ("128", 20.0)):
        for b in ("1", "2", "3", "4"):
            peaks[(b, seq)] = 100 + per * int(b)
    s = sweep(["batch=1,2,3,4", "seq=64,128"], peaks, limit_mib=175)
    mf = max_fit(s)
    # Largest by the first axis, then the second: batch=4 fits only at seq=64 (140 MiB; 180 MiB at seq=128).
    assert mf.measured == {"batch": "4", "seq": "64"}
    by_seq = {p.others["seq"]: p.value for p in mf.series}
    assert by_seq == {"64": 7, "128": 3}
    assert mf.predicted.others == {"seq": "64"} and mf.predicted.value == 7


def test_fit_line_residual_and_spread() -> None:
    line = fit_line([1, 2, 3], [10, 21, 30])
    assert line.points == 3 and line.spread == 20
    assert line.max_residual == pytest.approx(2 / 3)
