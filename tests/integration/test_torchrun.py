"""Two CPU ranks under torchrun (gloo), each exporting on port + LOCAL_RANK, scraped by a real
Prometheus with the demo rules: the ranks dashboard answers for both ranks, and
MemexporterRankImbalance fires for the rank that holds more memory, through a real Alertmanager
to a webhook.

Rank 1 holds 1 GiB more than rank 0 (``--rank-extra-mib 1:1024``) under a 2 GiB budget
(``--memory-limit-mib 2048``): its step peak sits about 0.5 GiB (25 % of its limit) above the
median rank, over the demo preset's 10 % threshold. The demo preset's windows (1m median, 1m
``for``) keep the whole test near 1.5 minutes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from memexporter import dashboards
from tests.support.alertmanager import WebhookReceiver, running_alertmanager
from tests.support.binaries import require
from tests.support.demo import SMALL_MODEL, running_torchrun_demo
from tests.support.ports import bindable, free_port_block
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.promql import substitute
from tests.support.rules import render_preset

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=85, waits=True)]

MiB = 1 << 20
RANKS = {"0", "1"}
ALERT = "MemexporterRankImbalance"


def _query(prom: Prometheus, panel_title: str) -> list[dict[str, Any]]:
    dash = dashboards.build()["memexporter-ranks.json"]
    (panel,) = [p for p in dash["panels"] if p["title"] == panel_title]
    (target,) = panel["targets"]
    return prom.query(substitute(target["expr"], {"job": "memexporter", "instance": ".+", "rank": ".+"}))


def _by_rank(result: list[dict[str, Any]]) -> dict[str, float]:
    return {s["metric"]["rank"]: float(s["value"][1]) for s in result}


def test_two_ranks_dashboards_and_rank_imbalance_alert(tmp_path: Path) -> None:
    require("prometheus")
    require("alertmanager")
    demo_rules = render_preset(tmp_path, "demo")
    base = free_port_block(2)
    targets = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    started = time.time()
    with (
        WebhookReceiver() as hook,
        running_alertmanager(webhook_url=hook.url) as am,
        running_torchrun_demo(
            base, *SMALL_MODEL, "--memory-limit-mib", "2048", "--rank-extra-mib", "1:1024"
        ) as torchrun,
        running_prometheus(targets, [demo_rules], alertmanager_url=am.url) as prom,
    ):
        prom.wait_targets_up(timeout=30)
        for rule_group in prom.rules():
            for rule in rule_group["rules"]:
                assert rule["health"] != "err", f"{rule['name']}: {rule.get('lastError')}"
        prom.wait_for(
            'count(count_over_time(memexporter_memory_peak_bytes{job="memexporter"}[1m]) >= 5) == 2', timeout=60
        )

        # Each rank is its own target and labels its series with its rank.
        info = prom.query('memexporter_process_info{job="memexporter"}')
        assert {(s["metric"]["rank"], s["metric"]["local_rank"], s["metric"]["world_size"]) for s in info} == {
            ("0", "0", "2"),
            ("1", "1", "2"),
        }
        assert {s["metric"]["instance"] for s in info} == set(targets)

        # The ranks dashboard answers for both ranks and points at rank 1.
        peaks = _by_rank(_query(prom, "Step peak per rank"))
        assert set(peaks) == RANKS
        assert peaks["1"] - peaks["0"] > 768 * MiB
        assert set(_by_rank(_query(prom, "Peak / limit per rank"))) == RANKS
        assert set(_by_rank(_query(prom, "Steps per second per rank"))) == RANKS
        (closest,) = _query(prom, "Rank closest to its limit")
        assert closest["metric"]["rank"] == "1"
        excess = _by_rank(_query(prom, "Excess over the median rank"))
        assert excess["1"] > 0.1 > excess["0"]
        (spread,) = _query(prom, "Peak spread across ranks (max - min)")
        assert spread["metric"]["device_kind"] == "cpu"
        assert float(spread["value"][1]) > 768 / 2048  # of the 2 GiB limit

        # The alert fires for rank 1 only, and reaches the webhook through Alertmanager.
        firing = prom.wait_for(f'ALERTS{{alertname="{ALERT}", alertstate="firing"}}', timeout=150)
        assert {s["metric"]["rank"] for s in firing} == {"1"}
        got = hook.wait_for(
            lambda p: p["status"] == "firing" and p["commonLabels"].get("alertname") == ALERT, timeout=30
        )
        assert [a["labels"]["rank"] for a in got.payload["alerts"]] == ["1"]
        assert got.time - started < 180
        assert torchrun.poll() is None, "torchrun exited during the test"
    assert torchrun.poll() is not None
    deadline = time.monotonic() + 10
    while not (bindable(base) and bindable(base + 1)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert bindable(base), "rank 0 still serving after torchrun stopped"
    assert bindable(base + 1), "rank 1 still serving after torchrun stopped"
