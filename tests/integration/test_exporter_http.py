"""The started exporter's HTTP over real sockets on loopback: the endpoints, content negotiation,
HEAD, the absolute form and the name filter, bad input on the socket, TLS, a raising collector, and
nothing written on the job's stderr. The lifecycle (ports, stop and start, torchrun ranks, fork, no
CUDA context) is in test_exporter_lifecycle.py. Real torch on CPU, no fakes."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.core import GaugeMetricFamily

import memexporter
from tests.support.web import base, get_answer

pytestmark = pytest.mark.usefixtures("no_exporter")


def test_endpoints() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    status, ctype, body = get_answer(base(exp) + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert 'memexporter_memory_used_bytes{device="cpu",rank="0"}' in body
    assert get_answer(base(exp) + "/healthz")[:1] == (200,)
    status, ctype, body = get_answer(base(exp) + "/")
    assert status == 200 and "text/html" in ctype and 'href="metrics"' in body
    assert get_answer(base(exp) + "/nope")[0] == 404
    assert exp.url == f"http://127.0.0.1:{exp.port}/metrics"


def test_requests_write_nothing_on_the_jobs_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    # The job's own output is what its user reads: no access log line per scrape, none per error.
    exp = memexporter.start(port=0, addr="127.0.0.1")
    url = base(exp)  # waits for the helper's bind, and so for start()'s one "serving" line
    capfd.readouterr()
    assert get_answer(url + "/metrics")[0] == 200
    assert get_answer(url + "/nope")[0] == 404
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        s.sendall(b"a b c d e\r\n\r\n")  # a 400
        s.recv(4096)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_openmetrics_when_asked() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    status, ctype, body = get_answer(base(exp) + "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and ctype.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    assert "# UNIT memexporter_memory_used_bytes bytes" in body


def test_post_is_rejected_and_serving_continues() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    req = urllib.request.Request(base(exp) + "/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 405
    assert get_answer(base(exp) + "/metrics")[0] == 200


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff\xfe garbage\r\n\r\n",
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"GET /metrics HTTP/x.y\r\n\r\n",
        b"a b c d e\r\n\r\n",
    ],
)
def test_garbage_on_the_socket_gets_4xx_and_serving_continues(garbage: bytes) -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        s.sendall(garbage)
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.") and reply.split()[1].startswith(b"4"), reply[:80]
    assert get_answer(base(exp) + "/metrics")[0] == 200


def test_oversized_request_line_does_not_stop_serving() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        try:
            s.sendall(b"GET /" + b"A" * 70000 + b" HTTP/1.1\r\n\r\n")
            reply = s.recv(4096)
        except ConnectionResetError:  # the server answered 414 and closed before reading it all
            reply = b"HTTP/1.0 414"
    assert reply.split()[1].startswith(b"4")
    assert get_answer(base(exp) + "/metrics")[0] == 200


def test_tls_cert_and_key_are_passed_through(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    exp = memexporter.start(port=0, addr="127.0.0.1", certfile=str(cert), keyfile=str(key))
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    status, _, body = get_answer(f"https://127.0.0.1:{exp.port}/metrics", context=ctx)
    assert status == 200 and "memexporter_memory_used_bytes" in body
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):  # no plain HTTP
        urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=3).read()


def test_raising_collector_over_http_costs_only_its_series(monkeypatch: pytest.MonkeyPatch) -> None:
    from memexporter.collectors.host import HostCollector

    def boom(self: object, scrape: object) -> list[object]:
        raise RuntimeError("injected collector failure")

    monkeypatch.setattr(HostCollector, "collect", boom)
    exp = memexporter.start(port=0, addr="127.0.0.1")
    status, _, body = get_answer(base(exp) + "/metrics")
    assert status == 200
    assert 'memexporter_collector_success{collector="host",rank="0"} 0.0' in body
    assert 'memexporter_collector_success{collector="memory",rank="0"} 1.0' in body
    assert "memexporter_host_rss_bytes" not in body
    assert 'memexporter_memory_used_bytes{device="cpu",rank="0"}' in body


def raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """``request`` as is on a fresh connection: the status, the headers and every byte after them."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize(("path", "status"), [("/metrics", 200), ("/healthz", 200), ("/", 200), ("/nope", 404)])
def test_head_carries_the_gets_content_length_and_no_body(path: str, status: int) -> None:
    # Before: HEAD /nope sent the 404's body, and every HEAD said Content-Length: 0.
    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.port is not None
    got, headers, body = raw(exp.port, f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert (got, body) == (status, b"")
    length = int(headers["content-length"])
    get_status, get_headers, get_body = raw(exp.port, f"GET {path} HTTP/1.0\r\n\r\n".encode())
    assert get_status == status and get_headers["content-type"] == headers["content-type"]
    if path == "/metrics":  # the values move between the two requests; the size barely
        assert abs(length - len(get_body)) < 200 and length > 1000
    else:
        assert length == len(get_body) > 0


def test_absolute_form_request_target_is_served_as_its_path() -> None:
    # RFC 9112 3.2.2: a server must accept "GET http://host:port/path"; before, a 404.
    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.port is not None
    status, _, body = raw(
        exp.port,
        f"GET http://127.0.0.1:{exp.port}/metrics HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{exp.port}\r\nConnection: close\r\n\r\n".encode(),
    )
    assert status == 200 and b'memexporter_memory_used_bytes{device="cpu",rank="0"}' in body
    status, _, body = raw(exp.port, b"GET HTTP://Trainer-0:9400/healthz?x=1 HTTP/1.0\r\n\r\n")
    assert (status, body) == (200, b"ok\n")


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
def test_name_filter_returns_only_the_named_samples(accept: str) -> None:
    # Before: an empty 200 for any name[] (prometheus_client looks the names up among what
    # collectors describe at registration, and ours describes nothing).
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    exp = memexporter.start(port=0, addr="127.0.0.1")
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    assert exp.flush()  # the snapshot with the third step (one is published each second)
    status, _, body = get_answer(
        base(exp) + "/metrics?name[]=memexporter_steps_total&name%5B%5D=memexporter_build_info",
        {"Accept": accept} if accept else None,
    )
    assert status == 200
    samples = [line for line in body.splitlines() if line and not line.startswith("#")]
    assert sorted(line.split("{")[0] for line in samples) == ["memexporter_build_info", "memexporter_steps_total"]
    assert 'memexporter_steps_total{rank="0"} 3.0' in body
    assert body.endswith("# EOF\n") == bool(accept)


def test_idle_client_does_not_block_tls_scrapes_or_stop(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    exp = memexporter.start(port=0, addr="127.0.0.1", certfile=str(cert), keyfile=str(key))
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    with socket.create_connection(("127.0.0.1", exp.port)):  # connects, never says hello
        t0 = time.monotonic()
        assert get_answer(f"https://127.0.0.1:{exp.port}/metrics", context=ctx)[0] == 200
        assert time.monotonic() - t0 < 5
        stopper = threading.Thread(target=exp.stop)
        stopper.start()
        stopper.join(timeout=10)
        assert not stopper.is_alive(), "stop() hung behind an idle TLS client"


def test_flush_waits_for_a_snapshot_begun_after_it() -> None:
    """``flush()`` called while a snapshot is being rendered returns only once one rendered after the call
    is served: it waited on the board's next generation, which that render (begun before) bumped, and a
    test of the Lightning callback read step 9 after step 10 (a fresh-clone run of 2026-11-28)."""
    exp = memexporter.start(port=0, addr="127.0.0.1")
    url = base(exp) + "/metrics"
    state = {"value": 1.0}
    rendering = threading.Event()

    class Slow:
        def collect(self) -> Any:
            seen = state["value"]
            rendering.set()
            time.sleep(0.5)  # the render is under way for half a second, with the value it began with
            yield GaugeMetricFamily("flush_probe", "state['value'] when the render began", value=seen)

    exp.registry.register(Slow())  # type: ignore[arg-type]
    assert rendering.wait(10), "no snapshot was rendered"
    rendering.clear()
    assert rendering.wait(10)  # a render is under way now, with the old value
    state["value"] = 2.0
    assert exp.flush()
    assert "flush_probe 2.0" in get_answer(url)[2]
