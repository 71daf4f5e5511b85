"""What serving costs the training process, measured where a busy machine cannot blur it (issue 35):
the job's own CPU time (``psutil``: its threads only, not its children) with and without a flood of every
route, and the latency of a paced scrape while a launch-bound loop holds the GIL (the first of up to six
10 s windows within the bound: on a shared 2-core machine another process can slow one window; it cannot
make the job's GIL reach the helper, which would show in every window), beside a plain server in a
process of its own that shows what the machine alone adds.

Before the helper, the flood cost the job its server's whole CPU budget (0.25 s at once, then 2 % of a
core: about 0.45 s in 10 s), and a scrape waited for the training thread to let go of the GIL."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from tests.support import forkserver
from tests.support.demo import module_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A training process with the exporter and per-module tracking: a launch-bound loop (tiny ops: the
# training thread holds the GIL between them), paced (argv[1]: seconds between steps, 0: as fast as it
# goes); argv[2] "0": steps without the model's work, so that the job's own CPU time is small and steady.
JOB = """
import sys, time
import torch
from torch import nn
import memexporter
torch.set_num_threads(1)
model = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(12)))
opt = torch.optim.AdamW(model.parameters())
exp = memexporter.start(port=0, addr="127.0.0.1", model=model, optimizer=opt)
print(exp.port, flush=True)
model(torch.randn(2, 16)).sum().backward()
pace, work, x = float(sys.argv[1]), sys.argv[2] == "1", torch.randn(2, 16)
while True:
    if work:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    else:
        memexporter.step()
    if pace:
        time.sleep(pace)
"""

# One client process, 4 threads, every route, back to back while stdin says "flood".
CLIENT = """
import socket, sys, threading
port, on, count = int(sys.argv[1]), threading.Event(), [0]
routes = [("/metrics", ""), ("/metrics", "Accept: application/openmetrics-text;version=1.0.0\\r\\nAccept-Encoding: gzip\\r\\n"),
          ("/metrics?name[]=memexporter_steps_total", ""), ("/live.json", ""), ("/", ""), ("/healthz", "")]
def flood(i):
    while True:
        on.wait()
        path, headers = routes[i % len(routes)]
        i += 1
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(f"GET {path} HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n{headers}\\r\\n".encode())
                while s.recv(65536):
                    pass
            count[0] += 1
        except OSError:
            pass
for n in range(4):
    threading.Thread(target=flood, args=(n,), daemon=True).start()
for line in sys.stdin:
    if line.strip() == "flood":
        on.set()
    else:
        on.clear()
        print(count[0], flush=True)
"""


# The machine's own share of a scrape's latency: a plain Python server in a process of its own, one thread,
# answering every request with a body of argv[1] bytes (the helper's). What slows it on a loaded box
# (other processes holding both cores) slows the helper alike; the job's GIL reaches neither.
CONTROL = """
import socket, sys
body = b"#" * int(sys.argv[1])
head = b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\nConnection: close\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body)
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        request = b""
        while b"\\r\\n\\r\\n" not in request and (chunk := conn.recv(65536)):
            request += chunk
        conn.sendall(head + body)
"""
BOUND = 0.020  # seconds: a scrape's p99 while the job trains


def start(script: str, *args: str) -> forkserver.Process:
    """The job, the client or the control, forked from the worker's zygote: what is measured is CPU time and latency
    from its start on, nothing of a fresh interpreter's."""
    return forkserver.popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=module_env(),
        scripts=True,
    )


@pytest.mark.slow(seconds=35)
def test_a_flood_of_every_route_costs_the_job_at_most_100_ms_of_cpu_in_10_s() -> None:
    job = start(JOB, "0.01", "0")
    client = None
    try:
        assert job.stdout is not None
        port = int(job.stdout.readline())
        proc = psutil.Process(job.pid)
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()  # the helper serves

        def cpu_over(seconds: float) -> float:
            times = proc.cpu_times()
            time.sleep(seconds)
            after = proc.cpu_times()
            return (after.user + after.system) - (times.user + times.system)

        client = start(CLIENT, str(port))
        assert client.stdin is not None and client.stdout is not None
        quiet = cpu_over(5.0)
        client.stdin.write("flood\n")
        client.stdin.flush()
        flooded = cpu_over(10.0)
        client.stdin.write("quiet\n")
        client.stdin.flush()
        answered = int(client.stdout.readline())
        quiet += cpu_over(5.0)
    finally:
        for p in (client, job):
            if p is not None:
                p.kill()
                p.wait()
    assert answered > 100, f"the flood got {answered} answers"
    assert flooded - quiet <= 0.1, f"the job spent {flooded:.3f} CPU s in 10 s of flood, {quiet:.3f} without"


def p99(took: list[float]) -> float:
    """The 99th percentile of 100 latencies (the second-longest)."""
    return sorted(took)[98]


@pytest.mark.slow(seconds=45)
def test_a_paced_scrape_at_10_per_second_answers_within_20_ms_at_p99_during_training() -> None:
    job = start(JOB, "0", "1")
    control = None
    try:
        assert job.stdout is not None
        url = f"http://127.0.0.1:{int(job.stdout.readline())}/metrics"
        size = len(urllib.request.urlopen(url, timeout=30).read())
        control = start(CONTROL, str(size))
        assert control.stdout is not None
        beside = f"http://127.0.0.1:{int(control.stdout.readline())}/metrics"
        windows: list[tuple[float, float]] = []  # (the helper's p99, the control's p99), seconds
        # Windows of 10 s, each server scraped 10 times a second as Prometheus paces it, the two interleaved,
        # until the helper is within the bound (six windows at most). Another process on the shared 2-core box
        # can slow a window (issue 40's fresh clone: p99 36-104 ms in six windows beside promtool and
        # chromium); it slows the control alike, and it cannot make the job's GIL reach the helper, which
        # every window would show against the control (94 ms before the helper).
        while len(windows) < 6 and not any(ours <= BOUND for ours, _ in windows):
            took: dict[str, list[float]] = {url: [], beside: []}
            next_at = time.monotonic()
            for _ in range(100):
                for target, times in took.items():
                    t0 = time.monotonic()
                    with urllib.request.urlopen(target, timeout=10) as r:
                        assert r.status == 200 and r.read()
                    times.append(time.monotonic() - t0)
                next_at += 0.1
                time.sleep(max(0.0, next_at - time.monotonic()))
            windows.append((p99(took[url]), p99(took[beside])))
    finally:
        for p in (control, job):
            if p is not None:
                p.kill()
                p.wait()
    said = "; ".join(f"helper {ours * 1e3:.1f} ms, control {theirs * 1e3:.1f} ms" for ours, theirs in windows)
    print(f"p99 of each 10 s window: {said}")
    # Within the bound in a window; or, where the machine slowed all six, no slower than the control beyond
    # machine noise (medians over the windows: loaded by 8 busy loops, the helper's p99 ran 13-28 ms to the
    # control's 11-31; a plain server on a thread of the training process, as before the helper, 58-104).
    helper, plain = statistics.median(w[0] for w in windows), statistics.median(w[1] for w in windows)
    assert any(ours <= BOUND for ours, _ in windows) or helper <= 1.5 * plain, said
