"""OTLP push as a user turns it on: `memexporter run` and the bootstrap, configured only by
environment variables, pushing to an OTLP/HTTP receiver that decodes the official
opentelemetry-proto messages (tests/support/otlp.py). What arrives is translated with
otlptranslator's rules (tests/support/otlp_names.py) and compared with a scrape of /metrics."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="needs pip install 'memexporter[otel]'")
from prometheus_client.parser import text_string_to_metric_families

from memexporter.bootstrap import path as bootstrap_path
from memexporter.otel import names
from tests.support import REPO_ROOT, forkserver
from tests.support.demo import module_env
from tests.support.otlp import OtlpHttpReceiver, Received, metrics, points, resource
from tests.support.otlp_names import families_read_by_shipped_queries, kind_of, label, translate
from tests.support.ports import closed_port, free_port
from tests.support.process import stop, tail
from tests.support.web import get_text

pytestmark = pytest.mark.integration

INTERVAL_MS = 250
SEMCONV = {i.name for i in names.instruments() if i.semconv is not None}
# Families whose value moves by itself between a scrape and a push (the process' RSS, the
# machine's free memory, timings): compared within a tolerance, the rest exactly.
LIVE = {
    "memexporter_memory_used_bytes",
    "memexporter_memory_committed_bytes",
    "memexporter_memory_limit_bytes",
    "memexporter_host_rss_bytes",
    "memexporter_host_available_bytes",
    "memexporter_oom_eta_seconds",
}
# The children: the HTTP helper always, and the forked DataLoader workers of each epoch, which come and
# go between the scrape and the push (seen: 27 MB scraped, 773 MB pushed). Both see the helper.
CHILDREN = "memexporter_host_children_rss_bytes"

# An ordinary training script: DataLoader workers (forked), a tracked model, a leak (so that the
# time to OOM is finite and pushed), then it waits for the test, stops memexporter itself and lives
# on for several export intervals.
SCRIPT = textwrap.dedent(
    """
    import os, sys, time, pathlib
    import torch
    import memexporter
    out = pathlib.Path(sys.argv[1])
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    memexporter.track(model, opt)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 32)), batch_size=8,
                                       num_workers=2, multiprocessing_context="fork")
    kept = []
    for epoch in range(3):  # ~10 s: the leak estimate skips the first 5 s and needs a 3 s span
        for (x,) in data:
            kept.append(torch.ones(1 << 18))  # 1 MiB a step
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.1)  # the workers live for several export intervals
    # Renamed into place: the test polls for the name and reads it at once, and a write_text it saw
    # between the create and the write read "" (a fresh-clone run: int('') failed).
    (out / "trained.tmp").write_text(str(os.getpid()))
    (out / "trained.tmp").rename(out / "trained")
    deadline = time.time() + 60
    while not (out / "go").exists() and time.time() < deadline:
        time.sleep(0.02)
    memexporter.stop()
    (out / "stopped.tmp").write_text(repr(time.time()))  # renamed into place too (float('') once)
    (out / "stopped.tmp").rename(out / "stopped")
    time.sleep(float(sys.argv[2]))  # several export intervals: a push now would be a bug
    """
)
STEPS = 3 * 32  # three epochs of 32 batches
STEPS_KEY = ("memexporter_steps_total", frozenset({("rank", "0")}))


def otel_env(extra: dict[str, str]) -> dict[str, str]:
    """``module_env`` without a developer's own OTEL_* settings."""
    env = {k: v for k, v in module_env(extra).items() if not k.startswith("OTEL_") or k in extra}
    return env


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the job exited early ({proc.returncode}):\n{tail(log)}"
        assert time.monotonic() < deadline, f"{path.name} not written within {timeout:.0f} s:\n{tail(log)}"
        time.sleep(0.05)
    return path.read_text()


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body = get_text(f"http://127.0.0.1:{port}/metrics")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }


def translated(r: Received) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A push as Prometheus' OTLP receiver would store it (the conventions' instruments left out)."""
    out = {}
    for name, m in metrics(r).items():
        if name in SEMCONV:
            continue
        family = translate(name, m.unit, kind_of(m))
        for attrs, value in points(m):
            out[(family, frozenset((label(k), str(v)) for k, v in attrs.items()))] = value
    return out


@pytest.mark.slow
def test_memexporter_run_pushes_what_it_serves(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port, log = free_port(), tmp_path / "job.log"
    with OtlpHttpReceiver() as rx:
        env = otel_env(
            {
                "MEMEXPORTER_OTEL": "1",
                "MEMEXPORTER_PORT": str(port),
                "MEMEXPORTER_ADDR": "127.0.0.1",
                "MEMEXPORTER_WARMUP_STEPS": "0",
                "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "OTEL_METRIC_EXPORT_INTERVAL": str(INTERVAL_MS),
                "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
                "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t0ken",
                "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=ci",
            }
        )
        with log.open("wb") as out:
            proc = forkserver.popen(
                [sys.executable, "-m", "memexporter", "run", str(script), str(tmp_path), str(4 * INTERVAL_MS / 1000)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        try:
            pid = int(wait_for_file(tmp_path / "trained", proc, log))
            # The first push that starts after a scrape: both read the same, idle, job (once the snapshot,
            # published each second, has its last step).
            end = time.monotonic() + 10
            while (scraped := scrape(port)).get(STEPS_KEY) != STEPS and time.monotonic() < end:
                time.sleep(0.1)
            t_scrape = time.time()
            after = rx.wait_for(
                lambda rs: any(r.at > t_scrape + INTERVAL_MS / 1000 for r in rs), 20, "a push after the scrape"
            )
            pushed = translated(next(r for r in after if r.at > t_scrape + INTERVAL_MS / 1000))
            (tmp_path / "go").write_text("")
            stopped = float(wait_for_file(tmp_path / "stopped", proc, log, timeout=30))
            assert proc.wait(timeout=30) == 0, tail(log)
        finally:
            stop(proc)
        received = rx.snapshot()

    # Names and labels: exactly the /metrics series (an ETA of +Inf would have no point: OTLP has no
    # +Inf, tests/unit/otel/test_bridge.py; here the job leaks, so the ETA is finite and must arrive).
    finite = {k: v for k, v in scraped.items() if math.isfinite(v)}
    assert 0 < finite[("memexporter_oom_eta_seconds", frozenset({("rank", "0"), ("device", "cpu")}))] < math.inf
    assert set(pushed) == set(finite), (sorted(set(finite) - set(pushed))[:5], sorted(set(pushed) - set(finite))[:5])
    for key, value in pushed.items():
        if key[0] in LIVE:
            assert value == pytest.approx(finite[key], rel=0.1), key
        elif key[0] == CHILDREN:
            assert value > 0 and finite[key] > 0, key
        elif key[0] != "memexporter_collector_duration_seconds":
            assert value == finite[key], key
    assert pushed[("memexporter_steps_total", frozenset({("rank", "0")}))] == STEPS
    # Every family the shipped rules and dashboards read arrived (the CUDA-only ones need a GPU,
    # tests/unit/otel/test_bridge.py pushes them from a synthetic device; the sharded-only one a sharded model).
    # The job's end: the HTTP helper serves it after the job is gone, nothing pushes it (the rules infer there).
    # A series that needs what this job lacks (inputs of several sizes, a declared largest input) is absent on
    # both sides alike (the names above are equal).
    absent = {
        n.spec.name
        for n in names.instruments()
        if n.spec.cuda_only or n.spec.sharded_only or n.spec.needs or n.spec.collector == "ending"
    }
    assert families_read_by_shipped_queries() - absent <= {name for name, _ in pushed}

    # Counters: cumulative monotonic sums with one start time, never going down.
    steps = [metrics(r)["memexporter.steps"] for r in received if "memexporter.steps" in metrics(r)]
    assert all(m.sum.is_monotonic and m.sum.aggregation_temporality == 2 for m in steps)  # 2: CUMULATIVE
    assert len({p.start_time_unix_nano for m in steps for p in m.sum.data_points}) == 1
    values = [m.sum.data_points[0].as_double for m in steps]
    assert values == sorted(values) and values[-1] == STEPS

    # stop() pushed a last time, and nothing came after it; DataLoader workers pushed nothing.
    assert received[-1].at <= stopped
    assert metrics(received[-1])["memexporter.steps"].sum.data_points[0].as_double == STEPS
    assert {resource(r)["service.instance.id"] for r in received} == {f"{socket.gethostname()}/{pid}"}
    res = resource(received[-1])
    assert (res["service.name"], res["deployment.environment.name"], res["process.pid"]) == ("memexporter", "ci", pid)
    assert received[0].headers["authorization"] == "Bearer t0ken"
    assert received[0].headers["content-encoding"] == "gzip"
    assert "cannot push" not in log.read_text()


def training(steps: int, then: str) -> str:
    """An unmodified training script: ``steps`` optimizer steps of a small model, then ``then``."""
    loop = f"""
        import sys, time, urllib.request
        import psutil, torch
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range({steps}):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
        """
    return textwrap.dedent(loop) + textwrap.dedent(then)


@pytest.mark.slow
def test_an_unreachable_collector_is_one_line_and_training_goes_on(tmp_path: Path) -> None:
    # Wrong protocols and missing packages: tests/unit/otel/test_sdk.py (one line each, too).
    closed, port = closed_port(), free_port()
    script = tmp_path / "train.py"
    script.write_text(
        training(
            3,
            """
        time.sleep(1.5)  # several export intervals
        body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
        assert 'memexporter_steps_total{rank="0"} 3.0' in body, body[:300]
        print("trained and scraped")
        """,
        )
    )
    env = otel_env(
        {
            "MEMEXPORTER_OTEL": "1",
            "MEMEXPORTER_STRICT": "0",
            "OTEL_METRIC_EXPORT_INTERVAL": str(INTERVAL_MS),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        }
    )
    argv = [
        sys.executable,
        "-m",
        "memexporter",
        "run",
        "--port",
        str(port),
        "--addr",
        "127.0.0.1",
        str(script),
        str(port),
    ]
    out = forkserver.run(argv, env=env, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "trained and scraped" in out.stdout
    # Nothing else on the job's stderr: no SDK retry warnings, no tracebacks.
    problems = [
        line for line in out.stderr.splitlines() if " ERROR " in line or " WARNING " in line or "Traceback" in line
    ]
    assert len(problems) == 1, out.stderr
    assert (
        f"OTEL_EXPORTER_OTLP_ENDPOINT='http://127.0.0.1:{closed}'" in problems[0]
        and "Connection refused" in problems[0]
    )


@pytest.mark.slow
def test_bootstrap_push_only_flushes_at_exit(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        training(
            5,
            """
        listening = [c for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN]
        assert not listening, listening
        print("no port, exiting without stop()")
        """,
        )
    )
    with OtlpHttpReceiver() as rx:
        env = otel_env(
            {
                "MEMEXPORTER_AUTOSTART": "1",
                "MEMEXPORTER_OTEL": "1",
                "MEMEXPORTER_HTTP": "0",
                "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "OTEL_METRIC_EXPORT_INTERVAL": "60000",
            }
        )
        env["PYTHONPATH"] = os.pathsep.join([bootstrap_path(), env["PYTHONPATH"]])
        out = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        received = rx.snapshot()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no port" in out.stdout
    # The interval (60 s) never elapsed: the one push is the exit hook's, with the final count.
    (last,) = received
    assert points(metrics(last)["memexporter.steps"]) == [({"rank": "0"}, 5.0)]
