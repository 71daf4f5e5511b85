"""The levers on the ``OomRisk`` that ``on_oom_risk`` callbacks receive (issue 44): a tuple, largest
first, each an estimate with its basis, from the rows of the tracked model (a real one, on CPU); without
a tracked model, the levers that need rows say so instead of a number."""

from __future__ import annotations

import pytest

from memexporter.oom.levers import TRACK
from memexporter.oom.risk import judge
from tests.unit.oom.test_risk import LIMIT, Thresholds, _sources, _steps
from tests.unit.tracking.test_phases import make_rig

torch = pytest.importorskip("torch", reason="the levers are sized from a tracked torch model's rows")


def test_without_a_tracked_model_the_row_levers_say_track() -> None:
    rig = make_rig()
    _steps(rig, 20, base=900, excursion=100)  # headroom: 1000 MiB of 1024
    risk = judge(_sources(rig), Thresholds())
    assert risk is not None and risk.reason == "headroom"
    assert {v.kind for v in risk.levers} >= {"checkpointing", "sharding", "precision"}
    assert all(v.freed_bytes is None and v.describe().endswith(TRACK) for v in risk.levers)
    assert "what would fit" not in risk.describe()  # no figure to lead with


def test_a_tracked_model_gives_sized_levers_largest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from memexporter.tracking import schedule
    from memexporter.tracking.modules import track

    monkeypatch.setattr(schedule, "RECORD_INTERVAL_S", 0.0)
    monkeypatch.setattr(schedule, "RECORD_EVERY", 1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with track(model, opt):
        model(torch.randn(32, 64)).square().mean().backward()
        opt.step()
        rig = make_rig()
        _steps(rig, 20, base=900, excursion=100)
        risk = judge(_sources(rig, LIMIT), Thresholds())
    assert risk is not None
    kinds = [v.kind for v in risk.levers]
    assert "precision" in kinds and "checkpointing" in kinds
    sized = [v.freed_bytes for v in risk.levers if v.freed_bytes is not None]
    assert sized == sorted(sized, reverse=True) and sized[0] > 0
    precision = next(v for v in risk.levers if v.kind == "precision")
    assert precision.freed_bytes == 3 * (64 * 64 + 64) * 4  # fp32 parameters and gradients, halved
    assert risk.describe().startswith("OOM risk on cpu (headroom")
    assert "; what would fit first: " in risk.describe() and "(estimate: " in risk.describe()
