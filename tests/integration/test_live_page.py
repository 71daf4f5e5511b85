"""The live page at ``/`` and ``/live.json`` on a real exporter over a real CPU training loop: the
figures are ``/metrics``' (read with the job paused between the two requests), the history grows
with the steps and stays bounded, HEAD and TLS work, and every endpoint is still linked from the
page."""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import memexporter
from memexporter.collectors import levers
from memexporter.serving.job.live import in_words
from memexporter.tracking.modules import active_handles

pytestmark = pytest.mark.integration


# Not tests.support.web.get_text: these tests read the status and every header, and send HEAD too.
def get(url: str, context: ssl.SSLContext | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10, context=context) as r:
        return r.status, dict(r.headers), r.read()


@pytest.fixture(autouse=True)
def _untrack() -> Iterator[None]:
    yield
    for handle in active_handles():  # the next test in this process sees no model of this one
        handle.remove()


def train(steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.AdamW(model.parameters())
    memexporter.track(model, opt)
    for _ in range(steps):
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def test_live_json_has_the_figures_of_metrics_and_the_page_links_every_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(levers, "PAGE_INTERVAL_S", 0.0)  # the levers of the flushed snapshot, not the first one's
    exp = memexporter.start(port=0, addr="127.0.0.1", warmup_steps=2)
    model, _ = train(12)
    assert exp.flush()  # a snapshot after the 12th step (one is published each second)
    base = exp.url.removesuffix("/metrics")  # type: ignore[union-attr]
    status, headers, body = get(base + "/live.json")
    doc: dict[str, Any] = json.loads(body)
    seen = metrics(get(base + "/metrics")[2].decode())
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert doc["rank"] == "0" and doc["steps"] == 12 == seen[("memexporter_steps_total", frozenset({("rank", "0")}))]
    cpu = next(d for d in doc["devices"] if d["device"] == "cpu")
    labels = frozenset({("rank", "0"), ("device", "cpu")})
    for key in ("memory_peak_bytes", "memory_baseline_bytes", "leak_rate_bytes_per_second"):
        assert cpu[key] == seen[(f"memexporter_{key}", labels)], key  # step figures: the same samples
    for key in ("memory_used_bytes", "memory_limit_bytes"):  # one collection renders both: the same readings
        assert cpu[key] == seen[(f"memexporter_{key}", labels)], key
    _, baseline, peak = cpu["history"][-1]  # the last boundary's step baseline and peak
    assert 0 < baseline <= peak
    trend = {
        k: seen[(f"memexporter_{k}", labels)]
        for k in ("leak_rate_bytes_per_second", "leak_bytes_per_step", "oom_eta_seconds")
    }
    assert cpu["in_words"] == in_words(trend)
    rows = {m["module"]: m for m in doc["modules"]}
    weight = sum(p.numel() * 4 for p in model[0].parameters())
    assert (
        rows["0"]["parameters"]
        == weight
        == seen[("memexporter_module_parameter_bytes", frozenset({("rank", "0"), ("module", "0")}))]
    )
    assert rows["0"]["optimizer_state"] >= 2 * weight and all(doc["health"].values())
    # What would fit, the top three (issue 44): the two Linear layers in float32 are the only sized lever.
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert [v["kind"] for v in doc["levers"]] == ["precision"] and doc["levers"][0]["freed_bytes"] == weights
    assert doc["levers"][0]["text"].startswith("precision: keep parameters and gradients in bf16")
    page = get(base + "/")[2].decode()
    assert 'id="levers"' in page and "data-lever" in page
    assert 'fetch("live.json"' in page  # relative: behind a path prefix too
    for href in ("metrics", "live.json", "healthz"):
        assert f'<a href="{href}">/{href}</a>' in page
    assert "https://" not in page.split("<script>")[1] and "<script src" not in page  # no CDN: self-contained
    status, headers, body = get(base + "/live.json", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 100
    exp.stop()


def test_live_json_over_tls(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    exp = memexporter.start(port=0, addr="127.0.0.1", certfile=str(cert), keyfile=str(key))
    train(3)
    assert exp.flush()
    context = ssl.create_default_context(cafile=str(cert))
    base = exp.url.removesuffix("/metrics")  # type: ignore[union-attr]
    assert base.startswith("https://")
    doc = json.loads(get(base + "/live.json", context)[2])
    assert doc["steps"] == 3 and b"live.json" in get(base + "/", context)[2]
    exp.stop()


def test_the_history_grows_with_the_steps_and_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from memexporter.tracking import history

    monkeypatch.setattr(history, "INTERVAL_S", 0.0)  # a point at every boundary
    monkeypatch.setattr(history, "MAX_POINTS", 10)
    exp = memexporter.start(port=0, addr="127.0.0.1")
    train(25)
    assert exp.flush()
    doc = json.loads(get(exp.url.removesuffix("/metrics") + "/live.json")[2])  # type: ignore[union-attr]
    cpu = next(d for d in doc["devices"] if d["device"] == "cpu")
    assert len(cpu["history"]) == 10 and [p[0] for p in cpu["history"]] == sorted(p[0] for p in cpu["history"])
    exp.stop()
