"""Per-module rows with no model named (tracking/discover.py, the ``auto_track`` knob): the model
is the outermost module run with grad whose parameters an optimizer steps; the knobs for rows
reach that tracking and ``start(model=...)``; an inference job stops the search."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import memexporter
from memexporter.config import auto_track_default
from memexporter.tracking import discover
from memexporter.tracking.modules import active_handles
from tests.support.models import Deep

pytestmark = pytest.mark.usefixtures("no_exporter")  # tests/support/fixtures.py


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(2, 5, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_auto_track_finds_the_trained_model_and_applies_the_row_knobs() -> None:
    memexporter.start(port=0, addr="127.0.0.1", auto_track=True, module_depth=1, max_modules=1)
    teacher, student = Deep(2), Deep(3)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    with torch.no_grad():
        teacher(torch.randn(2, 5, 16))  # no grad: never a candidate
    _train(student, opt, 1)
    assert not active_handles()  # chosen at the step, tracked at the next forward
    _train(student, opt, 2)
    (handle,) = active_handles()
    assert handle.model is student  # type: ignore[attr-defined]
    snap = handle.snapshot()
    assert snap.layout.names == ("(root)", "blocks", "out")  # module_depth=1
    assert snap.max_modules == 1
    assert sum(snap.activation) > 0
    assert not discover._active or not discover._active.active  # the global module hooks are off
    memexporter.stop()
    assert not active_handles()


def test_start_model_applies_max_modules_and_module_depth() -> None:
    model = Deep(12)
    memexporter.start(port=0, addr="127.0.0.1", model=model, max_modules=5, module_depth=2)
    (handle,) = active_handles()
    snap = handle.snapshot()
    assert snap.max_modules == 5  # was the default 100: the knob never reached track()
    assert max(n.count(".") for n in snap.layout.names) == 1


def test_track_defaults_to_the_running_exporters_row_knobs() -> None:
    memexporter.start(port=0, addr="127.0.0.1", max_modules=7, module_depth=1)
    handle = memexporter.track(Deep(3))
    assert handle.snapshot().max_modules == 7
    assert handle.snapshot().layout.names == ("(root)", "blocks", "out")
    handle.remove()


@pytest.mark.parametrize("grad", [True, False])
def test_a_job_that_never_steps_gives_up_with_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, grad: bool
) -> None:
    # Inference under no_grad counts too: before, its calls never did, and the global hooks (which
    # slow every module call) stayed for the life of the process.
    monkeypatch.setattr(discover, "GIVE_UP_CALLS", 5)
    monkeypatch.setattr(discover, "GIVE_UP_S", 0.0)
    memexporter.start(port=0, addr="127.0.0.1", auto_track=True)
    model = Deep(1)
    with caplog.at_level(logging.INFO, logger="memexporter"), torch.set_grad_enabled(grad):
        for _ in range(8):
            model(torch.randn(2, 5, 16))
    assert discover._active is not None and not discover._active.active
    assert [r for r in caplog.records if "auto_track found no model" in r.getMessage()]
    assert not active_handles()


def test_auto_track_is_on_where_no_model_can_be_named_unless_turned_off() -> None:
    assert auto_track_default(None, {}) is True
    assert auto_track_default(None, {"MEMEXPORTER_AUTO_TRACK": "0"}) is False
    assert auto_track_default(False, {}) is False
    with pytest.raises(ValueError, match="MEMEXPORTER_AUTO_TRACK"):
        auto_track_default(None, {"MEMEXPORTER_AUTO_TRACK": "maybe"})


def test_the_scripts_own_track_after_auto_track_takes_over() -> None:
    memexporter.start(port=0, addr="127.0.0.1", auto_track=True)
    model = Deep(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, 3)  # chosen at the 1st step, the loop seen round at the 2nd, tracked at the 3rd forward
    (found,) = active_handles()
    # The script tracks its model itself, later: no "already tracked" error, its options win.
    mine = memexporter.track(model, opt, prefix="mine")
    assert active_handles() == (mine,)
    assert found.removed
    with pytest.raises(ValueError, match="already tracked"):
        memexporter.track(model)  # a second explicit track() is still an error


def test_every_model_an_optimizer_steps_is_found_a_gan() -> None:
    # The textbook GAN loop steps D first; G (the larger) was tracked by no one before.
    memexporter.start(port=0, addr="127.0.0.1", auto_track=True)
    g, d = (
        nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 16)),
        nn.Sequential(nn.Linear(16, 4), nn.Linear(4, 1)),
    )
    opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())
    for _ in range(3):
        fake = g(torch.randn(4, 8))
        opt_d.zero_grad()
        (d(torch.randn(4, 16)).mean() - d(fake.detach()).mean()).backward()
        opt_d.step()
        opt_g.zero_grad()
        (-d(fake).mean()).backward()
        opt_g.step()
    assert {id(h.model) for h in active_handles()} == {id(g), id(d)}  # type: ignore[attr-defined]
