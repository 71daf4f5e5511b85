"""``python -m memexporter.healthcheck`` (the image's HEALTHCHECK) against a real exporter: healthy
while it serves, unhealthy with the reason once it stops, and probing where the settings say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import memexporter
from memexporter.cli import healthcheck
from tests.support.ports import free_port

pytestmark = pytest.mark.usefixtures("no_exporter")  # tests/support/fixtures.py


def _probe(port: int, addr: str = "0.0.0.0") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "MEMEXPORTER_PORT": str(port), "MEMEXPORTER_ADDR": addr}
    return subprocess.run(
        [sys.executable, "-m", "memexporter.healthcheck"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_healthy_while_serving_then_unhealthy_with_the_reason() -> None:
    port = memexporter.start(port=0, addr="127.0.0.1").port
    assert port is not None
    ok = _probe(port)  # the exporter binds 127.0.0.1; the default wildcard address probes loopback
    assert (ok.returncode, ok.stderr) == (0, "")
    memexporter.stop()
    down = _probe(port, "127.0.0.1")
    assert down.returncode == 1
    assert f"http://127.0.0.1:{port}/healthz is not healthy" in down.stderr
    assert "refused" in down.stderr.lower()


def test_a_server_that_is_not_memexporter_is_unhealthy() -> None:
    """Something else on the port (prometheus_client's own server has no /healthz: 200 on every
    path, so use a plain HTTP server that 404s) does not pass for the exporter."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            "/nonexistent-memexporter-test",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            result = _probe(port, "127.0.0.1")
            if "refused" not in result.stderr.lower():
                break
        assert result.returncode == 1
        assert "HTTP 404" in result.stderr
    finally:
        server.kill()
        server.wait(timeout=10)


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "http://127.0.0.1:9400/healthz"),
        ({"MEMEXPORTER_PORT": "9500", "MEMEXPORTER_ADDR": "::"}, "http://[::1]:9500/healthz"),
        ({"MEMEXPORTER_ADDR": "10.1.2.3"}, "http://10.1.2.3:9400/healthz"),
    ],
)
def test_url_follows_the_exporter_settings(env: dict[str, str], url: str) -> None:
    assert healthcheck.url(env) == url


def test_url_uses_tls_when_the_exporter_does(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"  # the settings only need the files to exist
    cert.touch()
    key.touch()
    env = {"MEMEXPORTER_CERTFILE": str(cert), "MEMEXPORTER_KEYFILE": str(key)}
    assert healthcheck.url(env) == "https://127.0.0.1:9400/healthz"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MEMEXPORTER_PORT": "0"}, "picks a random port"),
        ({"MEMEXPORTER_PORT": "http"}, "MEMEXPORTER_PORT must be an integer, got 'http'"),
    ],
)
def test_bad_settings_exit_2_naming_the_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        healthcheck.url(env)
    result = subprocess.run(
        [sys.executable, "-m", "memexporter.healthcheck"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr
