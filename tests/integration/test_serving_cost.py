"""What serving costs the training process, measured where a busy machine cannot blur it (issue 35):
the job's own CPU time (``psutil``: its threads only, not its children) with and without a flood of every
route, and the latency of a paced scrape while a launch-bound loop holds the GIL (the first of up to six
10 s windows within the bound: on a shared 2-core machine another process can slow one window; it cannot
make the job's GIL reach the helper, which would show in every window).

Before the helper, the flood cost the job its server's whole CPU budget (0.25 s at once, then 2 % of a
core: about 0.45 s in 10 s), and a scrape waited for the training thread to let go of the GIL."""

from __future__ import annotations

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


def start(script: str, *args: str) -> forkserver.Process:
    """The job or the client, forked from the worker's zygote: what is measured is CPU time and latency
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


@pytest.mark.slow(seconds=45)
def test_a_paced_scrape_at_10_per_second_answers_within_20_ms_at_p99_during_training() -> None:
    job = start(JOB, "0", "1")
    try:
        assert job.stdout is not None
        url = f"http://127.0.0.1:{int(job.stdout.readline())}/metrics"
        urllib.request.urlopen(url, timeout=30).read()
        windows: list[tuple[float, float, float]] = []
        # Windows of 10 s at 10 a second, as Prometheus paces them, until one is within the bound (six at
        # most): another process on a shared 2-core box can slow a window (CI: p99 23 ms in the best of
        # three, under a load of 4 test workers); it cannot make the job's GIL reach the helper, which
        # every window would show (94 ms before the helper).
        while len(windows) < 6 and not any(w[0] <= 0.020 for w in windows):
            took, next_at = [], time.monotonic()
            for _ in range(100):
                t0 = time.monotonic()
                with urllib.request.urlopen(url, timeout=10) as r:
                    assert r.status == 200 and r.read()
                took.append(time.monotonic() - t0)
                next_at += 0.1
                time.sleep(max(0.0, next_at - time.monotonic()))
            took.sort()
            windows.append((took[98], took[49], took[-1]))  # p99, p50, max
    finally:
        job.kill()
        job.wait()
    said = "; ".join(
        f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {top * 1e3:.1f} ms" for p99, p50, top in windows
    )
    assert min(w[0] for w in windows) <= 0.020, said
