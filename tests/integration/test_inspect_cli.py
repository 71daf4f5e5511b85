"""``memexporter inspect`` against real exporters on loopback: the tables, and every way the
endpoint can fail to answer, each with the reason and what to change."""

from __future__ import annotations

import argparse
import json
from typing import Any, ClassVar

import pytest
import torch
from prometheus_client import CollectorRegistry

import memexporter
from memexporter.diagnose.inspect import memory_url, render, run
from memexporter.server import Route, serve
from tests.support.exporter import no_exporter_around  # noqa: F401 (a fixture)
from tests.support.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_exporter_around")]


def inspect(url: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    args = argparse.Namespace(url=url, top=int(flags[flags.index("--top") + 1]) if "--top" in flags else 20,
                              json="--json" in flags, timeout=10.0)
    code = run(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("localhost:9401", "http://localhost:9401/debug/memory"),
        ("http://10.0.0.5:9400", "http://10.0.0.5:9400/debug/memory"),
        ("http://node7:9400/metrics", "http://node7:9400/debug/memory"),
        ("https://node7:9400/debug/memory/", "https://node7:9400/debug/memory/"),
        ("http://[::1]:9400/?x=1", "http://[::1]:9400/debug/memory"),
    ],
)
def test_urls(given: str, expected: str) -> None:
    assert memory_url(given) == expected


def test_tables_growth_first(capsys: pytest.CaptureFixture[str]) -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, census_every=2, census_budget=1)

    class Job:
        store: ClassVar[list[Any]] = []

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        Job.store.append(torch.ones(3, 1021))
    code, out, _ = inspect(f"127.0.0.1:{exp.port}", capsys, "--top", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("rank 0, pid ") and lines[0].endswith("step 10")
    assert out.index("Growing, fastest first") < out.index("OOM view") < out.index("Census:")
    row = next(line for line in lines if "float32[3, 1021]" in line)
    assert row.split()[:6] == ["cpu", "float32[3,", "1021]", "other", "9", "+1"]  # kept after the step
    assert row.endswith("Job.store (list)") and "12.0 KiB" in row
    census_rows = lines[lines.index(next(x for x in lines if x.startswith("Census:"))) + 2:][:3]
    assert len(census_rows) == 3 and "more)" in out
    code, out, _ = inspect(f"http://127.0.0.1:{exp.port}/metrics", capsys, "--json")
    assert code == 0 and json.loads(out)["growth"][0]["held_by"] == ["Job.store (list)"]
    Job.store.clear()


def test_no_census_yet_says_when(capsys: pytest.CaptureFixture[str]) -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, census_every=50)
    code, out, _ = inspect(f"127.0.0.1:{exp.port}", capsys)
    assert code == 0 and "no census yet: the first comes at step 50" in out and "nothing grows" in out


def test_debug_off_says_how_to_turn_it_on(capsys: pytest.CaptureFixture[str]) -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    code, _, err = inspect(f"127.0.0.1:{exp.port}", capsys)
    assert code == 1 and "404" in err and "MEMEXPORTER_DEBUG=1" in err


def test_forbidden_says_where_to_run_it(capsys: pytest.CaptureFixture[str]) -> None:
    def forbidden(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("403 Forbidden", [("Content-Type", "text/plain")])
        return [b"forbidden\n"]

    server = serve(CollectorRegistry(), 0, "127.0.0.1", routes={"/debug/memory": Route(forbidden, "x")})
    try:
        code, _, err = inspect(f"127.0.0.1:{server.port}", capsys)
    finally:
        server.stop()
    assert code == 1 and "403" in err and "debug_allow" in err


def test_nobody_listening_and_bad_urls(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = inspect(f"127.0.0.1:{free_port()}", capsys)
    assert code == 1 and "cannot reach" in err and "LOCAL_RANK" in err
    code, _, err = inspect("ftp://node7/", capsys)
    assert code == 2 and "not an http(s) URL" in err


def test_an_unknown_limit_reads_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    code, out, _ = inspect(f"127.0.0.1:{exp.port}", capsys, "--json")
    assert code == 0
    doc = json.loads(out)
    doc["oom"]["cpu"].update(limit_bytes=None, utilisation=None, oom_eta_seconds=None)  # as when no limit is known
    row = next(line for line in render(doc, 5).splitlines() if line.strip().startswith("cpu") and "none" in line)
    assert row.split()[3:5] == ["unknown", "-"]
