"""The started exporter over real HTTP on loopback: endpoints, negotiation, bad input, port
conflicts, stop/start, torchrun ranks, fork and TLS. Real torch on CPU, no fakes."""

from __future__ import annotations

import errno
import http.client
import logging
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import torch

import memexporter
from memexporter.tracking.modules import active_handles
from tests.support.ports import free_port

pytestmark = pytest.mark.usefixtures("no_exporter")


# Not tests.support.web.get_text: these tests read the status and Content-Type, of error answers too.
def get(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def base(exp: memexporter.Exporter) -> str:
    return f"http://127.0.0.1:{exp.port}"


def test_endpoints() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    status, ctype, body = get(base(exp) + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert 'memexporter_memory_used_bytes{device="cpu",rank="0"}' in body
    assert get(base(exp) + "/healthz")[:1] == (200,)
    status, ctype, body = get(base(exp) + "/")
    assert status == 200 and "text/html" in ctype and 'href="metrics"' in body
    assert get(base(exp) + "/nope")[0] == 404
    assert exp.url == f"http://127.0.0.1:{exp.port}/metrics"


def test_requests_write_nothing_on_the_jobs_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    # The job's own output is what its user reads: no access log line per scrape, none per error.
    exp = memexporter.start(port=0, addr="127.0.0.1")
    capfd.readouterr()
    assert get(base(exp) + "/metrics")[0] == 200
    assert get(base(exp) + "/nope")[0] == 404
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        s.sendall(b"a b c d e\r\n\r\n")  # a 400
        s.recv(4096)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_openmetrics_when_asked() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    status, ctype, body = get(base(exp) + "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and ctype.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    assert "# UNIT memexporter_memory_used_bytes bytes" in body


def test_post_is_rejected_and_serving_continues() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    req = urllib.request.Request(base(exp) + "/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 405
    assert get(base(exp) + "/metrics")[0] == 200


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
    assert get(base(exp) + "/metrics")[0] == 200


def test_oversized_request_line_does_not_stop_serving() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        try:
            s.sendall(b"GET /" + b"A" * 70000 + b" HTTP/1.1\r\n\r\n")
            reply = s.recv(4096)
        except ConnectionResetError:  # the server answered 414 and closed before reading it all
            reply = b"HTTP/1.0 414"
    assert reply.split()[1].startswith(b"4")
    assert get(base(exp) + "/metrics")[0] == 200


def test_taken_port_logs_loudly_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="memexporter"):
            exp = memexporter.start(port=port, addr="127.0.0.1")
        assert exp.port is None and exp.url is None
        msg = " ".join(r.getMessage() for r in caplog.records)
        assert str(port) in msg and "MEMEXPORTER_PORT" in msg and "dcgm-exporter" in msg
        assert "already in use" in msg and f"the argument port={port} in the code" in msg  # the cause, and the knob
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()  # the hooks still run
        assert exp.sources.steps is not None and exp.sources.steps.steps == 1
        exp.stop()
        with pytest.raises(OSError, match="already in use") as info:
            memexporter.start(port=port, addr="127.0.0.1", strict=True)
        assert info.value.errno == errno.EADDRINUSE


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"port": "abc"}, ValueError),
        ({"port": -1}, ValueError),
        ({"port": 70000}, ValueError),
        ({"port": [1]}, TypeError),
    ],
)
def test_bad_arguments_raise_before_anything_starts(kwargs: dict[str, object], error: type) -> None:
    threads, ports = threading.active_count(), _listening_ports()
    with pytest.raises(error, match="port"):
        memexporter.start(**kwargs)  # type: ignore[arg-type]
    assert memexporter.exporter.running() is None
    assert (threading.active_count(), _listening_ports()) == (threads, ports), "a server was started"


def test_bad_environment_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEXPORTER_PORT", "xyz")
    with pytest.raises(ValueError, match="MEMEXPORTER_PORT"):
        memexporter.start()


def test_idempotent_start_warns_and_returns_running(caplog: pytest.LogCaptureFixture) -> None:
    first = memexporter.start(port=0, addr="127.0.0.1")
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        second = memexporter.start(port=0, addr="127.0.0.1")
    assert second is first
    assert "already running" in caplog.text


def test_stop_frees_the_port_and_start_works_again() -> None:
    port = free_port()
    exp = memexporter.start(port=port, addr="127.0.0.1")
    assert exp.port == port
    exp.stop()
    assert exp.port is None and exp.url is None  # a stopped exporter names no endpoint
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    again = memexporter.start(port=port, addr="127.0.0.1")
    assert again is not exp and again.port == port
    assert get(base(again) + "/metrics")[0] == 200


@pytest.mark.parametrize("how", ["memexporter.stop()", "with"])
def test_module_stop_and_with_block_stop_the_running_exporter(how: str) -> None:
    from tests.support.ports import bindable

    port = free_port()
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if how == "with":
        with memexporter.start(port=port, addr="127.0.0.1") as exp:
            assert memexporter.exporter.running() is exp and exp.port == port and not bindable(port)
    else:
        exp = memexporter.start(port=port, addr="127.0.0.1")
        assert memexporter.exporter.running() is exp and exp.port == port and not bindable(port)
        memexporter.stop()
    assert memexporter.exporter.running() is None
    assert bindable(port), "the port is still held after stop"
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert exp.sources.steps is not None and exp.sources.steps.steps == 0, "a stopped exporter still counts steps"
    memexporter.stop()  # a no-op when none runs


def test_torchrun_rank_binds_port_plus_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    while True:  # need port+1 free too
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                break
            except OSError:
                port = free_port()
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    exp = memexporter.start(port=port, addr="127.0.0.1")
    assert exp.port == port + 1
    body = get(base(exp) + "/metrics")[2]
    assert 'memexporter_process_info{hostname="' in body and 'local_rank="1",rank="5",world_size="8"' in body
    series = [line for line in body.splitlines() if line and not line.startswith("#")]
    assert all('rank="5"' in line for line in series), "every series carries rank"


def _listening_ports(pid: int | None = None) -> set[int]:
    """TCP ports a process (this one by default) holds a listening socket on (its own descriptors, via psutil)."""
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, rows: int) -> None:
    model(torch.randn(rows, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_forked_child_serves_counts_and_hooks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DataLoader worker forks from a training process with a running exporter and a tracked
    model. In the child (checked there, reported over a pipe): start() serves nothing, no
    collector yields a series, no hook counts a step or publishes module figures, the child holds
    no listening socket, stop() returns at once and leaves the parent alone, and after the
    parent's stop() the port is free while the child lives."""
    from memexporter.tracking import gradients as tracking_optimizer
    from tests.support.forked import run_forked
    from tests.support.ports import bindable

    monkeypatch.setattr(tracking_optimizer, "STEP_COUNT_INTERVAL_S", 0.0)  # every step recounts
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    exp = memexporter.start(port=free_port(), addr="127.0.0.1", model=model, optimizer=opt)
    port, handle, steps = exp.port, exp.tracked[0], exp.sources.steps
    assert port is not None and steps is not None
    _train_step(model, opt, rows=2)
    # The same observations in the parent see a serving, counting exporter: they can fail.
    assert steps.steps == 1 and sum(handle.snapshot().activation) > 0
    assert port in _listening_ports(exp.helper_pid) and port not in _listening_ports()  # the helper's, not the job's
    assert len(list(exp.registry.collect())) > 0

    def at_fork() -> dict[str, object]:
        snap, counted = handle.snapshot(), steps.steps
        child = memexporter.start(port=0, addr="127.0.0.1")
        _train_step(model, opt, rows=5)  # another batch size: a recorded forward would publish new figures
        memexporter.step()
        # A worker that calls stop() (atexit, a with-block) must neither hang on the parent's
        # server, which has no thread here, nor take anything from the parent.
        stopper = threading.Thread(target=exp.stop, daemon=True)
        stopper.start()
        stopper.join(timeout=10)
        return {
            "stop() returned": not stopper.is_alive(),
            "start() port": child.port,
            "running()": memexporter.exporter.running() is not None,
            "threads": threading.active_count(),
            "listening ports": sorted(_listening_ports()),
            "series collected": len(list(exp.registry.collect())),
            "steps counted": steps.steps - counted,
            "module figures republished": handle.snapshot() is not snap,
        }

    def stop_in_parent() -> None:
        # (a shutdown() of the listening socket both share would stop the parent's server too)
        assert get(base(exp) + "/metrics")[0] == 200, "the child's stop() stopped the parent's server"
        exp.stop()

    def afterwards() -> dict[str, object]:
        return {"listening ports": sorted(_listening_ports()), "port free": bindable(port)}

    in_child, after_stop = run_forked(at_fork, stop_in_parent, afterwards)
    assert in_child == {
        "stop() returned": True,
        "start() port": None,
        "running()": False,
        "threads": 1,
        "listening ports": [],
        "series collected": 0,
        "steps counted": 0,
        "module figures republished": False,
    }
    assert after_stop == {"listening ports": [], "port free": True}
    again = memexporter.start(port=port, addr="127.0.0.1", strict=True)  # the parent can bind it again
    assert again.port == port and get(base(again) + "/metrics")[0] == 200


def test_tls_cert_and_key_are_passed_through(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    exp = memexporter.start(port=0, addr="127.0.0.1", certfile=str(cert), keyfile=str(key))
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    status, _, body = get(f"https://127.0.0.1:{exp.port}/metrics", context=ctx)
    assert status == 200 and "memexporter_memory_used_bytes" in body
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):  # no plain HTTP
        urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=3).read()


# Records every call of torch.cuda's lazy initialiser (what creates a context), from any thread.
# On a CPU-only torch the call fails instead of creating a context, so is_initialized() alone
# could never fail there: the spy sees the attempt on both.
NO_CUDA_CONTEXT = """
import sys, threading, urllib.request
import torch, torch.cuda
lazy, attempts = torch.cuda._lazy_init.__code__, []
def spy(frame, event, arg):
    if event == "call" and frame.f_code is lazy:
        attempts.append(threading.current_thread().name)
sys.setprofile(spy)
threading.setprofile(spy)
import memexporter
e = memexporter.start(port=0, addr="127.0.0.1")
model = torch.nn.Linear(4, 4)
memexporter.track(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
urllib.request.urlopen(e.url, timeout=10).read()
e.stop()
sys.setprofile(None)
print(torch.cuda.is_initialized(), attempts)
"""


def test_import_start_track_and_scrape_create_no_cuda_context() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_CUDA_CONTEXT], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False []", out.stdout + out.stderr


def test_raising_collector_over_http_costs_only_its_series(monkeypatch: pytest.MonkeyPatch) -> None:
    from memexporter.collectors.host import HostCollector

    def boom(self: object, scrape: object) -> list[object]:
        raise RuntimeError("injected collector failure")

    monkeypatch.setattr(HostCollector, "collect", boom)
    exp = memexporter.start(port=0, addr="127.0.0.1")
    status, _, body = get(base(exp) + "/metrics")
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
    status, _, body = get(
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
        assert get(f"https://127.0.0.1:{exp.port}/metrics", context=ctx)[0] == 200
        assert time.monotonic() - t0 < 5
        stopper = threading.Thread(target=exp.stop)
        stopper.start()
        stopper.join(timeout=10)
        assert not stopper.is_alive(), "stop() hung behind an idle TLS client"


def test_start_with_model_on_a_running_exporter_tracks_it() -> None:
    memexporter.start(port=0, addr="127.0.0.1")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    exp = memexporter.start(port=0, addr="127.0.0.1", model=model)
    (handle,) = exp.tracked
    assert exp.flush()
    body = get(base(exp) + "/metrics")[2]
    assert "memexporter_module_parameter_bytes" in body
    exp.stop()
    assert exp.tracked == []
    assert handle not in active_handles(), "stop() left the model tracked"


@pytest.mark.parametrize(
    ("env", "match"),
    [({"LOCAL_RANK": "abc"}, "LOCAL_RANK"), ({"LOCAL_RANK": "-1"}, "LOCAL_RANK"), ({"LOCAL_RANK": "7"}, "65535")],
)
def test_bad_local_rank_or_port_overflow_is_a_clear_error(
    env: dict[str, str], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        memexporter.start(port=65530, addr="127.0.0.1")


def test_port_zero_under_torchrun_is_a_free_port_for_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")  # port 0 + LOCAL_RANK must not become port 3
    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.port is not None and exp.port > 1024
    assert get(base(exp) + "/metrics")[0] == 200
