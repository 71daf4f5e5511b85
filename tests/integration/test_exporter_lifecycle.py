"""The started exporter's lifecycle over real HTTP on loopback: a taken port, bad arguments and
environment, an idempotent start, stop and start again, torchrun ranks and their ports, a forked
child, no CUDA context, and start(model=) on a running exporter. What it answers over the wire is in
test_exporter_http.py. Real torch on CPU, no fakes."""

from __future__ import annotations

import errno
import logging
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import psutil
import pytest
import torch

import memexporter
from memexporter.tracking.modules import active_handles
from tests.support.ports import free_port
from tests.support.web import base, get_answer

pytestmark = pytest.mark.usefixtures("no_exporter")


def test_a_run_that_stops_before_the_report_still_says_the_port_is_taken(caplog: pytest.LogCaptureFixture) -> None:
    """stop() right after start(), before the helper has reported its bind (a short script, a
    framework run on a loaded box): the taken port is still logged, not lost with the helper."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="memexporter"):
            memexporter.start(port=port, addr="127.0.0.1").stop()
    assert any(f"port {port} is already in use" in r.getMessage() for r in caplog.records), caplog.text


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
    # What is new, not counts: an earlier test's thread that ends meanwhile is no server left out.
    threads, ports = set(threading.enumerate()), _listening_ports()
    with pytest.raises(error, match="port"):
        memexporter.start(**kwargs)  # type: ignore[arg-type]
    assert memexporter.exporter.running() is None
    assert (set(threading.enumerate()) - threads, _listening_ports() - ports) == (set(), set()), "a server was started"


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
    assert get_answer(base(again) + "/metrics")[0] == 200


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
    body = get_answer(base(exp) + "/metrics")[2]
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
    # What the worker listens on itself, which the child inherits, is not the exporter's: gloo's listener,
    # which outlives the one-rank process group of tests/unit/tracking/test_modules_sharded.py (destroyed
    # with its module; the socket stays for the worker's life): a child listed it once, after that module.
    inherited = _listening_ports()

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
            "listening ports": sorted(_listening_ports() - inherited),
            "series collected": len(list(exp.registry.collect())),
            "steps counted": steps.steps - counted,
            "module figures republished": handle.snapshot() is not snap,
        }

    def stop_in_parent() -> None:
        # (a shutdown() of the listening socket both share would stop the parent's server too)
        assert get_answer(base(exp) + "/metrics")[0] == 200, "the child's stop() stopped the parent's server"
        exp.stop()

    def afterwards() -> dict[str, object]:
        return {"listening ports": sorted(_listening_ports() - inherited), "port free": bindable(port)}

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
    assert again.port == port and get_answer(base(again) + "/metrics")[0] == 200


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


def test_start_with_model_on_a_running_exporter_tracks_it() -> None:
    memexporter.start(port=0, addr="127.0.0.1")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    exp = memexporter.start(port=0, addr="127.0.0.1", model=model)
    (handle,) = exp.tracked
    assert exp.flush()
    body = get_answer(base(exp) + "/metrics")[2]
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
    assert get_answer(base(exp) + "/metrics")[0] == 200
