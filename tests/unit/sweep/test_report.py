"""The sweep's reading of an exposition, its OOM verdict, and its outputs (table, JSON, CSV, plot)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest
from torch import nn

import memexporter
from memexporter.sweep.child import Outcome
from memexporter.sweep.fit import max_fit
from memexporter.sweep.grid import parse_grid
from memexporter.sweep.reading import Observed, parse
from memexporter.sweep.report import as_json, table, write_csv
from memexporter.sweep.runner import MiB, Run, Sweep, judge
from tests.support import REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "golden" / "exposition.txt"


def test_reading_the_golden_exposition() -> None:
    # The golden file comes from fake backends (SYNTHETIC numbers), but in the real exposition format.
    obs = Observed()
    obs.add(parse(GOLDEN.read_text()))
    assert obs.steps == 40 and obs.device == "cuda:0"
    assert obs.peak_reserved["cuda:0"] == 6442450944 and obs.peak_allocated["cuda:0"] == 5368709120
    assert obs.limits == {"cpu": 12884901888, "cuda:0": 79456894976}
    assert obs.ooms == 1 and obs.split is None
    run = Run({"batch": "8"})
    judge(run, Outcome(["train.py"], 1, observed=obs, exit_code=0, stopped_by="steps"), limit_mib=None)
    # The reserved mark is the peak on CUDA; the allocator's OOM count makes it an OOM even though it was caught.
    assert run.peak_bytes == 6442450944 and run.baseline_bytes == 3262119936
    assert (
        run.oom
        and run.fits is False
        and run.oom_reason is not None
        and "memexporter_allocator_ooms_total" in run.oom_reason
    )


def test_reading_a_real_exporter_with_a_tracked_model() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 100))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    exp = memexporter.start(port=0, addr="127.0.0.1", model=model, optimizer=opt)
    try:
        for _ in range(3):
            idx = torch.randint(0, 100, (4, 16))
            model(idx).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        text = generate_latest(exp.registry).decode()
    finally:
        exp.stop()
    reading = parse(text)
    # The cheap parse of most polls: the same figures, without the module rows.
    light = parse(text, split_too=False)
    assert light.split is None and (light.steps, light.devices, light.host_rss) == (
        reading.steps,
        reading.devices,
        reading.host_rss,
    )
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert reading.steps == 3
    assert reading.split is not None
    assert reading.split["parameters"] == params and reading.split["gradients"] == params
    # AdamW keeps exp_avg and exp_avg_sq per parameter, plus a scalar step tensor each.
    assert params * 2 <= reading.split["optimizer_state"] <= params * 2 + 4 * 8 * len(list(model.parameters()))
    assert reading.split["activations"] > 0
    assert reading.devices["memexporter_memory_peak_bytes"]["cpu"] > 0


def outcome(
    stderr: str = "", exit_code: int = 0, stopped_by: str | None = None, steps: int = 3, peak_mib: float = 100
) -> Outcome:
    obs = Observed(steps=steps, peaks={"cpu": peak_mib * MiB}, limits={"cpu": 1000 * MiB}, scrapes=steps)
    return Outcome(["train.py"], 1, observed=obs, exit_code=exit_code, stopped_by=stopped_by, stderr=stderr)


@pytest.mark.parametrize(
    ("out", "status", "reason"),
    [
        (outcome(stopped_by="steps", exit_code=-2), "ok", None),
        (outcome(exit_code=0, steps=5), "ok", None),  # exited by itself before K steps: measured as it is
        (
            outcome("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", exit_code=1),
            "oom",
            "out of memory: torch.OutOfMemoryError",
        ),
        (outcome("Traceback...\nMemoryError", exit_code=1, steps=0), "oom", "out of memory: MemoryError"),
        (outcome(exit_code=-9), "oom", "killed by SIGKILL, which the sweep did not send"),
        (outcome(exit_code=137), "oom", "killed by SIGKILL"),  # a shell reports its child's SIGKILL as 137
        (outcome(exit_code=-9, stopped_by="steps"), "ok", None),  # our own SIGKILL after the grace period
        (outcome(stopped_by="steps", peak_mib=1200), "oom", "peak 1200.0 MiB over the limit 1000.0 MiB"),
        (outcome("ValueError: bad shape", exit_code=1), "failed", None),
        # A CPU MemoryError the script caught and reported, then trained on: still an OOM.
        (
            outcome("batch too large (MemoryError), retrying smaller", stopped_by="steps", exit_code=0),
            "oom",
            "out of memory: batch too large",
        ),
        (outcome(stopped_by="interrupt", exit_code=-2), "interrupted", None),
    ],
)
def test_the_oom_verdict(out: Outcome, status: str, reason: str | None) -> None:
    run = Run({"batch": "1"})
    judge(run, out, limit_mib=None)
    assert run.status == status
    assert run.oom == (status == "oom") and run.fits == {"ok": True, "oom": False}.get(status)
    assert (run.oom_reason or "").startswith(reason or ""), run.oom_reason


def test_limit_mib_overrides_the_device_limit() -> None:
    run = Run({"batch": "1"})
    judge(run, outcome(stopped_by="steps", peak_mib=300), limit_mib=256)
    assert run.limit_bytes == 256 * MiB and run.oom and run.oom_reason == "peak 300.0 MiB over the limit 256.0 MiB"


@pytest.mark.parametrize(
    ("split_steps", "shown"),
    [
        (0, {"parameters": MiB, "activations": 0.0}),
        (2, {"parameters": MiB, "gradients": MiB, "optimizer_state": 2 * MiB, "activations": 0.0}),
    ],
)
def test_gradients_and_optimizer_state_read_before_any_step_are_unknown_not_zero(
    split_steps: int, shown: dict[str, float]
) -> None:
    out = outcome(exit_code=0)
    zero = 0.0 if split_steps == 0 else 1.0  # before the first step there is neither
    out.observed.split = {
        "parameters": MiB,
        "gradients": zero * MiB,
        "optimizer_state": zero * 2 * MiB,
        "activations": 0.0,
    }
    out.observed.split_steps = split_steps
    run = Run({"batch": "1"})
    judge(run, out, limit_mib=None)
    assert run.split == shown  # a family left out is "-" in the table (report.size(None))


def finished_sweep() -> Sweep:
    s = Sweep(parse_grid(["batch=1,2,4,8"]), ["train.py", "--batch", "{batch}"], 10, 520)
    for b, peak in (("1", 300), ("2", 350), ("4", 450)):
        s.runs.append(
            Run(
                {"batch": b},
                ["train.py", "--batch", b],
                "ok",
                "cpu",
                10,
                peak * MiB,
                peak_rss_bytes=peak * MiB,
                baseline_bytes=(peak - 10) * MiB,
                split={"parameters": MiB, "gradients": MiB, "optimizer_state": 2 * MiB, "activations": int(b) * MiB},
                step_seconds=0.05 * int(b),
                limit_bytes=520 * MiB,
                fits=True,
                exit_code=-2,
            )
        )
    s.runs.append(Run({"batch": "8"}, status="skipped", fits=False, skipped_by={"batch": "16"}))
    return s


def test_json_and_csv_agree(tmp_path: Path) -> None:
    s = finished_sweep()
    doc = as_json(s, max_fit(s))
    json.dumps(doc)  # serialisable
    assert doc["max_fit"]["measured"] == {"batch": 4}
    assert doc["max_fit"]["predicted"] == 5 and doc["max_fit"]["predicted_params"] == {"batch": 5}
    assert [r["fits"] for r in doc["runs"]] == [True, True, True, False]
    assert doc["runs"][3]["skipped"] is True and doc["runs"][3]["skipped_because"] == {"batch": 16}
    assert doc["runs"][0]["headroom_bytes"] == 220 * MiB
    write_csv(doc, tmp_path / "s.csv")
    with (tmp_path / "s.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["batch"] for r in rows] == ["1", "2", "4", "8"]
    assert [int(r["peak_bytes"]) for r in rows[:3]] == [r["peak_bytes"] for r in doc["runs"][:3]]
    assert rows[2]["activations_bytes"] == str(4 * MiB) and rows[3]["skipped_because"] == "batch=16"


def test_table() -> None:
    s = finished_sweep()
    text = table(s, max_fit(s))
    lines = text.splitlines()
    assert lines[0].split() == [
        "#",
        "batch",
        "peak",
        "baseline",
        "params",
        "grads",
        "optim",
        "activ",
        "step",
        "headroom",
        "result",
    ]
    assert lines[3].split()[:3] == ["3", "4", "450.0"] and lines[3].endswith("fits")
    assert lines[4].endswith("skipped (batch=16 ran out of memory)")
    assert "largest that fits, measured:  batch=4" in text
    assert "largest that fits, predicted: batch=5 (line through 3 runs: 50.0 MiB per batch + 250.0 MiB)" in text


def test_the_plot_is_a_png_with_a_line_per_series_and_the_limit(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the optional matplotlib (in the dev extra)")
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    from memexporter.sweep.plot import LIMIT_COLOR, plot

    s = Sweep(parse_grid(["batch=1,2,4", "seq=64,128"]), ["train.py"], 10, 600)
    for seq, per in (("64", 50), ("128", 100)):
        for b in ("1", "2", "4"):
            peak = (200 + per * int(b)) * MiB
            s.runs.append(
                Run(
                    {"batch": b, "seq": seq},
                    status="ok" if peak <= 600 * MiB else "oom",
                    peak_bytes=peak,
                    fits=peak <= 600 * MiB,
                    oom=peak > 600 * MiB,
                    device="cpu",
                )
            )
    path = tmp_path / "sweep.png"
    fig = plot(s, max_fit(s), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = fig.axes[0]
    series = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines}
    assert series["seq=64"] == ([1, 2, 4], [250, 300, 400])
    assert series["seq=128"] == ([1, 2, 4], [300, 400, 600 + 0])
    assert series["limit 600.0 MiB"][1] == [600, 600]
    assert ax.get_xlabel() == "batch" and ax.get_ylabel() == "peak RSS (MiB)"
    # The PNG really shows them: each line's colour is among its pixels.
    image = (imread(str(path))[:, :, :3] * 255).round().astype(int)
    assert image.shape[0] > 300 and image.shape[1] > 500
    pixels = {tuple(px) for row in image for px in row}
    for color in (LIMIT_COLOR, ax.lines[0].get_color(), ax.lines[1].get_color()):
        assert tuple(round(c * 255) for c in to_rgb(color)) in pixels, color
