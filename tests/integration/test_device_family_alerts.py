"""The whole chain per device family (issue 26): the real backends over each SYNTHETIC family fixture
(AMD through ROCm's torch.cuda and amdsmi, Intel's torch.xpu, Apple's MPS), a step tracker and the
real registry collected at a scrape every 15 s of a simulated run; the exposition passes the real
``promtool check metrics``, and the shipped rules, run by the real ``promtool test rules`` over the
scraped series, fire MemexporterMemoryLeak on the family's device when memory held between steps
grows by 5 % of the limit an hour, and fire nothing when it does not."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from memexporter.backends import select
from memexporter.tracking.steps import StepTracker
from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.fakes import FakeHost, registry_for, sources
from tests.support.traces import Scraped, input_series
from tests.unit.backends.test_device_families import KIND, LABEL, MPS, ROCM, XPU, answers, install

pytestmark = pytest.mark.integration

RULES = REPO_ROOT / "alerts" / "memexporter.rules.yml"
STEP_S, MINUTES = 15, 150
TARGET = {"job": "memexporter", "instance": "trainer-0:9400"}


def _grow(name: str, a: dict[str, Any], by: int) -> None:
    """The job holds ``by`` more bytes between steps: allocated and reserved grow, the device's free
    memory shrinks by as much (the limit stays), and the driver counts it for this process."""
    stats = a["memory_stats"] if name == MPS else a["devices"]["0"]["memory_stats"]
    for key in ("allocated_bytes", "reserved_bytes"):
        stats[f"{key}.all.current"] += by
        stats[f"{key}.all.peak"] = max(stats[f"{key}.all.peak"], stats[f"{key}.all.current"])
    if name == MPS:
        a["memory_info"][0] -= by
        return
    a["devices"]["0"]["mem_get_info"][0] -= by
    if name == ROCM:
        card = a["amdsmi"]["gpus"][1]
        card["memory"]["vram_used"] += by
        mine = next(p for p in card["processes"] if p["pid"] == "self")
        mine["memory_usage"]["vram_mem"] += by


def scraped_run(mp: pytest.MonkeyPatch, name: str, leak_share_per_hour: float) -> tuple[Scraped, str]:
    """Every series of a simulated run, one step and one scrape every STEP_S seconds; and the last exposition."""
    a = answers(name)
    install(mp, name, a)
    allocator, driver = select.backends(KIND[name])
    now = [0.0]
    tracker = StepTracker(
        allocator,
        FakeHost(),
        window=200,
        warmup_steps=20,
        clock=lambda: now[0],
        host_peak=lambda: 0,
        wall=lambda: 1.8e9 + now[0],
    )
    reg = registry_for(sources(allocator, driver, FakeHost(), steps=tracker))  # type: ignore[arg-type]
    limit = reg.get_sample_value("memexporter_memory_limit_bytes", {"rank": "3", "device": LABEL[name]})
    assert limit, f"{name}: no limit to leak against"
    per_step = int(leak_share_per_hour * limit * STEP_S / 3600)
    count = int(MINUTES * 60 / STEP_S) + 1
    out = Scraped(STEP_S, count)
    for k in range(count):
        now[0] = float(k * STEP_S)
        _grow(name, a, per_step)
        tracker.step()
        # A scrape reads what the registry collects: the text exposition of the same samples,
        # rendered and parsed at each of 600 scrapes, was three quarters of the test's CPU time.
        # It is rendered once, from the last state, for promtool's lint.
        for family in reg.collect():
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out.put(s.name, {**TARGET, **s.labels}, k, s.value)
        out.put("up", TARGET, k, 1.0)
    text = generate_latest(reg).decode()
    return out, text


def rule_test(scraped: Scraped, tests: str) -> str:
    groups = [g["name"] for g in yaml.safe_load(RULES.read_text())["groups"]]
    return (
        f"rule_files:\n  - {RULES}\nevaluation_interval: 1m\ngroup_eval_order: {groups}\ntests:\n"
        f"  - interval: {STEP_S}s\n{input_series(scraped)}    promql_expr_test:\n{tests}"
    )


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("promtool"), *args], input=stdin, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(params=[ROCM, XPU, MPS], ids=["amd", "intel", "apple"])
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_exposition_passes_promtool_and_a_leak_fires_on_the_familys_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, family: str
) -> None:
    scraped, text = scraped_run(monkeypatch, family, leak_share_per_hour=0.05)
    lint = promtool("check", "metrics", stdin=text)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    device = LABEL[family]
    assert f'device="{device}"' in text
    path = tmp_path / "leak.yml"
    path.write_text(
        rule_test(
            scraped,
            f"""\
      - expr: count by (alertname, device) (ALERTS{{alertstate="firing", scope="rank"}})
        eval_time: {MINUTES}m
        exp_samples:
          - labels: '{{alertname="MemexporterMemoryLeak",device="{device}"}}'
            value: 1
""",
        )
    )
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_flat_memory_fires_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, family: str) -> None:
    scraped, _ = scraped_run(monkeypatch, family, leak_share_per_hour=0.0)
    path = tmp_path / "flat.yml"
    path.write_text(
        rule_test(
            scraped,
            f"""\
      - expr: count_over_time(ALERTS{{alertstate="firing"}}[{MINUTES}m])
        eval_time: {MINUTES}m
        exp_samples: []
""",
        )
    )
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
