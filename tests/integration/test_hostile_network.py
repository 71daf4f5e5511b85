"""A hostile network against the exporter of a training process: trickling clients, port scans, bursts,
idle connections across stop(), a low descriptor limit. The exporter runs on loopback, started in this
process or in a child whose stderr and descriptors the test inspects; its HTTP server runs in the helper
process (``server_threads`` counts that process's threads), or in this process for the tests of the
server alone (``serve()`` over ``tests.support.snapshots.rendering``)."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client import CollectorRegistry

import memexporter
from memexporter.serving import budget, listener, server
from tests.support import forkserver
from tests.support.hostile import burst, reset_connection, trickle
from tests.support.snapshots import rendering
from tests.support.stderr import besides_serving
from tests.support.web import get_text

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("no_exporter")


def scrape(port: int, timeout: float = 10.0) -> str:
    return get_text(f"http://127.0.0.1:{port}/metrics", timeout)


def dropped(body: str) -> dict[str, float]:
    return {
        m[0]: float(m[1])
        for m in re.findall(r'memexporter_http_dropped_connections_total\{rank="0",reason="(\w+)"\} (\S+)', body)
    }


def server_threads(exp: Any) -> int:
    """The helper's threads but its main one: the acceptor and the workers answering (0 once it is gone)."""
    try:
        return len(os.listdir(f"/proc/{exp.helper_pid}/task")) - 1
    except (OSError, TypeError):
        return 0


@pytest.mark.slow
def test_trickling_clients_are_cut_at_the_deadline_and_never_hold_a_thread_each() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.port is not None
    peak_threads, scrape_s = 0, []
    done = threading.Event()

    def watch() -> None:  # what the server costs while 100 clients trickle, and whether it still serves
        nonlocal peak_threads
        while not done.is_set():
            peak_threads = max(peak_threads, server_threads(exp))
            t0 = time.monotonic()
            scrape(exp.port or 0)
            scrape_s.append(time.monotonic() - t0)
            done.wait(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        clients = trickle(exp.port, count=100, interval=0.5, duration=listener.DEADLINE + 8)
    finally:
        done.set()
        watcher.join()
    held = [c.closed_at - c.opened if c.closed_at is not None else float("inf") for c in clients]
    assert max(held) <= listener.DEADLINE + 3, f"a trickling client held its connection {max(held):.1f} s"
    # The acceptor and at most WORKERS answering scrapes: never one thread per client.
    assert peak_threads <= listener.WORKERS + 1, peak_threads
    assert scrape_s and max(scrape_s) < 3.0, f"scrapes during the trickle took up to {max(scrape_s):.1f} s"
    end = time.monotonic() + 10  # the helper's counts reach the job within a second, its snapshot within another
    while (counts := dropped(scrape(exp.port)))["timeout"] + counts["evicted"] < 100 and time.monotonic() < end:
        time.sleep(0.2)
    assert counts["timeout"] + counts["evicted"] >= 100, counts


@pytest.mark.slow
def test_with_a_low_file_limit_trickling_clients_never_take_the_jobs_descriptors(tmp_path: Path) -> None:
    # The case: RLIMIT_NOFILE 256, a job holding 150 files (say, dataset shards) and
    # opening one more each step, 300 trickling clients. Before, they took every descriptor
    # left: the job's open() failed with EMFILE and /metrics stopped answering.
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent("""
        import json, os, resource, sys, time
        import torch
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        import memexporter
        shards = [open(os.devnull) for _ in range(150)]
        exp = memexporter.start(port=0, addr="127.0.0.1")
        print(exp.port, len(os.listdir("/proc/self/fd")), flush=True)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        steps = failures = most = 0
        end = time.monotonic() + float(sys.argv[1])
        while time.monotonic() < end:
            model(torch.randn(16, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
            try:
                with open(__file__) as f:  # the job's own I/O, every step
                    f.read(1)
            except OSError:
                failures += 1
            most = max(most, len(os.listdir("/proc/self/fd")))
            steps += 1
            time.sleep(0.01)
        print(json.dumps({"steps": steps, "failures": failures, "most_fds": most}), flush=True)
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = forkserver.popen(  # forked: its limit and descriptors are its own, set and counted by the job
        [sys.executable, str(job), "14"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        scripts=True,
    )
    try:
        assert proc.stdout is not None
        port, base_fds = (int(x) for x in proc.stdout.readline().split())
        clients = trickle(port, count=300, interval=1.0, duration=6)
        if len(clients) < 300:
            proc.kill()
            out, err = proc.communicate(timeout=60)
            pytest.fail(
                f"the server stopped taking connections after {len(clients)}; the job exited with "
                f"{proc.returncode}: {out[-500:]} {err[-1500:]}"
            )
        body = scrape(port)  # still answering while the clients trickle
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    report = json.loads(out.splitlines()[-1])
    assert report["failures"] == 0, f"the job's open() failed {report['failures']} times: {report}"
    assert report["steps"] > 0
    cap, _ = listener.limits(256)
    # Three of the exporter's own (listening socket, wake-up pipe) are in base_fds already.
    assert report["most_fds"] <= base_fds + cap + 2, (report, base_fds, cap)
    assert 'memexporter_collector_success{collector="host",rank="0"} 1.0' in body
    assert any(c.closed_at is not None for c in clients)
    assert besides_serving(err) == "", err


def test_port_scans_resets_and_idle_clients_leave_nothing_on_stderr(tmp_path: Path) -> None:
    # A connect-then-reset (a port scanner), a reset in mid-request and a connection closed
    # before its request each printed a socketserver traceback on the job's stderr before.
    child = forkserver.popen(
        [
            sys.executable,
            "-c",
            "import memexporter, sys; e = memexporter.start(port=0, addr='127.0.0.1'); "
            "print(e.port, flush=True); sys.stdin.read(); e.stop()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        scripts=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        for i in range(60):
            reset_connection(port, send=b"GET /metrics HTTP/1.1\r\n" if i % 2 else b"")
        for _ in range(20):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        # The helper's counts reach the job within a second, and its next snapshot within another.
        end = time.monotonic() + 10
        while dropped(body := scrape(port)).get("reset", 0) < 60 and time.monotonic() < end:
            time.sleep(0.2)
        _out, err = child.communicate("", timeout=60)
    finally:
        child.kill()
    assert besides_serving(err) == "", f"{len(err.splitlines())} lines on the job's stderr:\n{err[:2000]}"
    assert dropped(body)["reset"] >= 60, dropped(body)


def test_a_burst_of_200_connections_gets_no_1s_outlier() -> None:
    # With the stdlib's listen backlog of 5 a burst overflows the queue: the kernel drops SYNs
    # and the clients retry after 1 s. Connect times are the kernel's, so they do not depend
    # on how busy this machine is.
    exp = memexporter.start(port=0, addr="127.0.0.1")
    result = burst(exp.port or 0, 200)
    assert result.statuses.count(b"200") == 200, sorted(set(result.statuses))
    slow = sorted(t for t in result.connect_s if t >= 1.0)
    assert not slow, f"{len(slow)} of 200 connections waited >= 1 s to connect: {slow[:5]}"


def test_stop_closes_connections_accepted_before_it() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    helper = exp.helper_pid
    early = socket.create_connection(("127.0.0.1", exp.port or 0), timeout=5)
    time.sleep(0.2)  # accepted by now
    exp.stop()
    try:
        early.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        reply = early.recv(65536)
    except OSError:  # reset: closed, as it should be
        reply = b""
    finally:
        early.close()
    assert not reply.startswith(b"HTTP/1.0 200"), "a request after stop() was answered"
    assert helper is not None and not psutil.pid_exists(helper), "the helper outlived stop()"


def test_stop_returns_without_waiting_for_a_poll_interval() -> None:
    # The stdlib's serve_forever() polls every 0.5 s, and shutdown() waits for the poll.
    times = []
    for _ in range(10):
        exp = memexporter.start(port=0, addr="127.0.0.1")
        socket.create_connection(("127.0.0.1", exp.port or 0), timeout=5).close()
        time.sleep(0.05)  # idle again: the stdlib's loop is back in its 0.5 s poll
        t0 = time.monotonic()
        exp.stop()
        times.append(time.monotonic() - t0)
    times.sort()
    assert times[len(times) // 2] < 0.1, f"stop() took {times}"


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.02)


BIG = 16 * 1024 * 1024  # more than the kernel's buffers on both sides hold


def big(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return [b"x" * BIG]


@pytest.mark.parametrize(("how", "reason"), [("reset", "write"), ("stops reading", "timeout")])
def test_a_client_lost_while_its_answer_is_written_is_counted(how: str, reason: str) -> None:
    # Before: wsgiref swallowed the reset (and the timeout) while writing: not counted at all.
    srv = server.serve(
        rendering(CollectorRegistry()),
        0,
        "127.0.0.1",
        routes={"/big": server.Route(big, "16 MiB")},
        deadline=2.0 if how == "stops reading" else listener.DEADLINE,
    )
    client = socket.socket()
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", srv.port))
        client.sendall(b"GET /big HTTP/1.0\r\n\r\n")
        assert client.recv(64).startswith(b"HTTP/1.0 200")  # the answer is being written
        if how == "reset":
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        wait_for(lambda: sum(srv.stats.dropped().values()) > 0, 15, "the lost connection counted")
        time.sleep(0.1)  # nothing else comes
        assert {k: v for k, v in srv.stats.dropped().items() if v} == {reason: 1}
    finally:
        client.close()
        srv.stop()


# A training job: one (cheap) step every 10 ms, its exporter on loopback. It prints its port.
JOB = """
import select, sys
import memexporter
e = memexporter.start(port=0, addr="127.0.0.1")
print(e.port, flush=True)
while not select.select([sys.stdin], [], [], 0.01)[0]:
    memexporter.step()
e.stop()
"""


def flood(port: int, path: str, until: threading.Event, answers: Counter[bytes]) -> None:
    """Valid requests back to back, one connection each, until ``until``."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    while not until.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(request)
                first = s.recv(65536)
                while s.recv(65536):
                    pass
            answers[first[9:12]] += 1
        except OSError:
            answers[b"error"] += 1


def steps_total(port: int) -> tuple[float, float]:
    """``(seconds the scrape took, memexporter_steps_total)``, as Prometheus asks for it."""
    t0 = time.monotonic()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={
            "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3",
            "Accept-Encoding": "gzip",
        },
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    found = re.search(rb"^memexporter_steps_total\{[^}]*\} (\S+)", body, re.M)
    assert found, body[:300]
    return time.monotonic() - t0, float(found.group(1))


@pytest.mark.parametrize("path", ["/metrics", "/healthz"])
def test_a_request_flood_costs_the_job_at_most_the_cpu_budget_and_scrapes_stay_fresh(path: str) -> None:
    # Before: 4 threads flooding took most of a core in the job's process (x1.7 to x4.5 step time).
    job = forkserver.popen(  # forked: its CPU time is counted from its start, by psutil
        [sys.executable, "-c", JOB],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        scripts=True,
    )
    try:
        assert job.stdout is not None
        port = int(job.stdout.readline())
        proc = psutil.Process(job.pid)

        def cpu() -> float:
            times = proc.cpu_times()
            return float(times.user + times.system)

        steps_total(port)
        c0, t0 = cpu(), time.monotonic()
        time.sleep(1.0)  # what the job costs without a flood
        quiet = (cpu() - c0) / (time.monotonic() - t0)
        until, answers = threading.Event(), Counter[bytes]()
        threads = [threading.Thread(target=flood, args=(port, path, until, answers)) for _ in range(4)]
        c0, t0 = cpu(), time.monotonic()
        for t in threads:
            t.start()
        scrapes = []
        try:
            for _ in range(5):  # a Prometheus with scrape_interval: 1s
                started = time.monotonic()
                scrapes.append(steps_total(port))
                time.sleep(max(0.0, started + 1.0 - time.monotonic()))
        finally:
            until.set()
            for t in threads:
                t.join()
        elapsed = time.monotonic() - t0
        spent = cpu() - c0 - quiet * elapsed
    finally:
        job.kill()
        job.wait()
    allowed = budget.BURST + budget.SHARE * elapsed
    assert spent < allowed + 0.2, f"the flood cost the job {spent:.2f} CPU s in {elapsed:.1f} s; {answers}"
    assert answers[b"200"] > 10 * elapsed, answers  # it is served, slowly
    took = [s[0] for s in scrapes]
    assert max(took) < 1.0, f"scrapes took {took}"
    values = [s[1] for s in scrapes]
    # A snapshot a second: two scrapes a second apart may now and then read the same one, never an older one.
    assert sorted(values) == values and len(set(values)) >= 3, f"steps_total did not advance: {values}"


class FrozenClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_while_the_cpu_budget_is_in_debt_nothing_is_accepted() -> None:
    clock = FrozenClock()
    spent = budget.Budget(share=1.0, burst=0.5, max_debt=1.0, clock=clock)
    spent.charge(1.5)  # a second in debt, on a clock that only the test moves
    srv = server.serve(rendering(CollectorRegistry()), 0, "127.0.0.1", budget=spent)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:  # the kernel's queue takes it
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            s.settimeout(0.5)
            with pytest.raises(TimeoutError):
                s.recv(64)  # not accepted, so not answered (an absence: only a wait shows it)
            clock.now += 2.0  # the budget is back
            s.settimeout(10)
            assert s.recv(64).startswith(b"HTTP/1.0 200")
    finally:
        srv.stop()


def test_extra_routes_above_their_rate_limit_get_429_with_retry_after() -> None:
    def tiny(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"debug\n"]

    srv = server.serve(rendering(CollectorRegistry()), 0, "127.0.0.1", routes={"/debug/x": server.Route(tiny, "x")})
    try:
        answers: list[bytes] = []
        while len(answers) < 50 and not (answers and answers[-1].startswith(b"HTTP/1.0 429")):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                s.sendall(b"GET /debug/x HTTP/1.0\r\n\r\n")
                answers.append(s.makefile("rb").read())
        statuses = [a.split()[1] for a in answers]
        assert statuses[:5] == [b"200"] * 5 and statuses[-1] == b"429", statuses  # 5 at once, then 1 a second
        assert b"\r\nRetry-After: 1\r\n" in answers[-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as r:
            assert r.status == 200  # /metrics is not limited by it
    finally:
        srv.stop()
