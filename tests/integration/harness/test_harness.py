"""Self-test of the harness: real Prometheus scrapes a real Alertmanager, evaluates a rule that
always fires, sends it to Alertmanager, which posts it to the webhook receiver; then everything
stops and frees its port."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import binaries
from tests.support.alertmanager import WebhookReceiver, running_alertmanager
from tests.support.ports import free_port, free_port_block
from tests.support.process import ProcessError, running_command
from tests.support.prometheus import QueryError, running_prometheus

pytestmark = pytest.mark.integration


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT connections do not count
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_prometheus_alertmanager_webhook_round_trip(tmp_path: Path) -> None:
    rules = tmp_path / "always.rules.yml"
    rules.write_text(
        "groups:\n- name: harness\n  rules:\n"
        "  - alert: HarnessAlwaysFiring\n    expr: vector(1)\n    labels: {severity: info}\n"
        "    annotations: {summary: Always fires.}\n",
        encoding="utf-8",
    )
    started = time.time()
    with WebhookReceiver() as hook, running_alertmanager(webhook_url=hook.url) as am:
        am_port = _port_of(am.url)
        with running_prometheus([f"127.0.0.1:{am_port}"], [rules], alertmanager_url=am.url) as prom:
            prom.wait_targets_up(timeout=30)
            up = prom.wait_for('up{job="memexporter"} == 1', timeout=30)
            assert up[0]["metric"]["instance"] == f"127.0.0.1:{am_port}"
            assert prom.query("1 + 1") == [{"metric": {}, "value": [pytest.approx(time.time(), abs=60), "2"]}]
            with pytest.raises(QueryError, match="parse error"):
                prom.query("sum(")
            got = hook.wait_for(
                lambda p: p["status"] == "firing" and p["commonLabels"].get("alertname") == "HarnessAlwaysFiring",
                timeout=60,
            )
            assert got.time >= started
            assert got.payload["version"] == "4"
            assert [a["labels"]["alertname"] for a in am.alerts()] == ["HarnessAlwaysFiring"]
            assert prom.alerts()[0]["state"] == "firing"
            prom_proc, prom_port = prom.proc, _port_of(prom.url)
        assert prom_proc.poll() is not None, "prometheus still running after the context exited"
        assert _free(prom_port)
        am_proc = am.proc
    assert am_proc.poll() is not None
    assert _free(am_port)


def test_alertmanager_does_not_bind_the_cluster_port(tmp_path: Path) -> None:
    with WebhookReceiver() as hook, running_alertmanager(webhook_url=hook.url) as am:
        assert am.status()["cluster"]["status"] == "disabled"


def test_process_error_carries_the_output() -> None:
    with (
        pytest.raises(ProcessError, match="boom"),
        running_command(["sh", "-c", "echo boom; exit 3"], ["http://127.0.0.1:1/never"], timeout=10),
    ):
        pass


def test_stop_kills_the_whole_process_group() -> None:
    port = free_port()
    script = f"import http.server as h; h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
    with running_command(["sh", "-c", f'python3 -c "{script}" & wait'], [f"http://127.0.0.1:{port}/"]) as proc:
        assert proc.poll() is None
    assert proc.poll() is not None
    deadline = time.monotonic() + 5
    while not _free(port) and time.monotonic() < deadline:  # the grandchild goes with the group
        time.sleep(0.1)
    assert _free(port)


def test_free_port_block_is_consecutive_and_free() -> None:
    base = free_port_block(3)
    assert all(_free(base + i) for i in range(3))


def test_require_skips_or_fails_with_the_package_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEXPORTER_BIN_PROMTOOL", "/nonexistent/promtool")
    monkeypatch.delenv(binaries.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"promtool.*apt-get install prometheus"):
        binaries.require("promtool")
    monkeypatch.setenv(binaries.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="promtool"):
        binaries.require("promtool")
    monkeypatch.delenv("MEMEXPORTER_BIN_PROMTOOL")
    assert subprocess.run([binaries.require("promtool"), "--version"], capture_output=True, check=False).returncode == 0
