"""``memexporter inspect`` against real exporters on loopback: the tables, and every way the
endpoint can fail to answer, each with the reason and what to change; against hostile servers
(small socket servers here: one that trickles, one that never stops, ones that are not
memexporter), each a one-line error within the deadline and the size cap; the job's token found
in its file for a local port; and the dump files of ``oom_dump_dir``. The CLI runs as a
subprocess where the one-line errors are checked. Token files go to ``tmp_path``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from prometheus_client import CollectorRegistry

import memexporter
from memexporter.cli.inspect import memory_url, render, run
from memexporter.diagnose.report import document
from memexporter.exporter import running
from memexporter.serving.server import Route, serve
from tests.support.demo import module_env
from tests.support.ports import free_port
from tests.support.snapshots import rendering

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_exporter", "runtime_dir")]


def inspect(url: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    exp = running()
    token = exp.diagnostics.token.value if exp and exp.diagnostics and exp.diagnostics.token else None
    args = argparse.Namespace(
        url=url,
        top=int(flags[flags.index("--top") + 1]) if "--top" in flags else 20,
        json="--json" in flags,
        timeout=10.0,
        token=token,
    )
    code = run(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def cli(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """``python -m memexporter inspect ARGS`` as a subprocess with at most 1 GiB of address space
    (an inspect that buffers without a cap fails here instead of filling the machine)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "memexporter", "inspect", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=module_env({"XDG_RUNTIME_DIR": os.environ["XDG_RUNTIME_DIR"], "HOME": os.environ["HOME"], **(env or {})}),
        preexec_fn=limit,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def one_line_error(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@contextlib.contextmanager
def hostile(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A loopback server that reads a request and then calls ``answer(conn, stopping)``."""
    srv = socket.create_server(("127.0.0.1", 0))
    stopping = threading.Event()

    def one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            answer(conn, stopping)

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        stopping.set()
        srv.close()


def trickle_body(conn: socket.socket, stopping: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    while not stopping.wait(0.3):
        conn.sendall(b" ")


def trickle_headers(conn: socket.socket, stopping: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not stopping.wait(0.3):
        conn.sendall(b"X: y\r\n")


def endless_body(conn: socket.socket, stopping: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
    chunk = b"0," * (1 << 19)
    while not stopping.is_set():
        conn.sendall(chunk)


def fixed(
    status: str, body: bytes, ctype: str = "application/json"
) -> Callable[[socket.socket, threading.Event], None]:
    def answer(conn: socket.socket, stopping: threading.Event) -> None:
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )

    return answer


def raw(data: bytes) -> Callable[[socket.socket, threading.Event], None]:
    def answer(conn: socket.socket, stopping: threading.Event) -> None:
        conn.sendall(data)

    return answer


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
    census_rows = lines[lines.index(next(x for x in lines if x.startswith("Census:"))) + 2 :][:3]
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

    server = serve(rendering(CollectorRegistry()), 0, "127.0.0.1", routes={"/debug/memory": Route(forbidden, "x")})
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
    assert row.split()[5:7] == ["unknown", "-"]


@pytest.mark.parametrize("answer", [trickle_body, trickle_headers], ids=["body", "headers"])
def test_the_timeout_is_for_the_whole_request(answer: Callable[[socket.socket, threading.Event], None]) -> None:
    with hostile(answer) as port:
        code, out, err, took = cli(f"127.0.0.1:{port}", "--timeout", "2", timeout=30)
    assert code == 1 and out == ""
    assert "no complete answer within 2 s (--timeout)" in one_line_error(err)
    assert took < 2 + 5, f"inspect --timeout 2 took {took:.1f} s"


def test_an_endless_answer_stops_at_the_size_cap() -> None:
    with hostile(endless_body) as port:
        code, _, err, took = cli(f"127.0.0.1:{port}", timeout=30)
    assert code == 1 and "larger than 32 MiB, the most inspect reads" in one_line_error(err)
    assert took < 15


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (fixed("200 OK", b'{"hello": "world"}'), "not a memexporter /debug/memory document (no 'rank')"),
        (fixed("200 OK", b"[1, 2, 3]"), "not a memexporter /debug/memory document (JSON list, not an object)"),
        (
            fixed("200 OK", b'{"rank": "0", "pid": 1, "step": 2, "growth": {}, "autograd": [], "census": null}'),
            "('growth' is a dict)",
        ),
        (
            fixed(
                "200 OK",
                b'{"rank": "0", "pid": 1, "step": 2, "growth": [{"x": 1}], "autograd": [], "census": null,'
                b' "next_census_step": 3, "census_every": 1}',
            ),
            "not a memexporter /debug/memory document (no ",
        ),
        (fixed("200 OK", b"<html><body>Grafana</body></html>", "text/html"), "(not JSON: "),
        (fixed("200 OK", b"[" * 100_000), "not a memexporter /debug/memory document"),
        (fixed("200 OK", b"\xff\xfe{}"), "(not JSON: "),
        (
            fixed("500 Internal Server Error", b"boom\n\x1b[31mred\nmore lines\n", "text/plain"),
            "HTTP 500 Internal Server Error: boom",
        ),
        (fixed("302 Found", b""), "a redirect to ?: inspect follows none"),
        (raw(b"SSH-2.0-OpenSSH_9.6\r\n"), "not an HTTP answer"),
        (raw(b""), "not an HTTP answer"),
        (raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}"), "the answer was cut short"),
    ],
    ids=[
        "other-json",
        "json-list",
        "wrong-type",
        "deep-field",
        "html",
        "nested",
        "not-utf8",
        "500",
        "redirect",
        "ssh",
        "closed",
        "cut-short",
    ],
)
def test_an_answer_that_is_not_memexporters_is_one_line(
    answer: Callable[[socket.socket, threading.Event], None], said: str
) -> None:
    with hostile(answer) as port:
        code, out, err, _ = cli(f"127.0.0.1:{port}", "--timeout", "10")
    assert code == 1 and out == "" and said in one_line_error(err)
    assert "\x1b" not in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["localhost:abc"], "memexporter inspect: bad port in 'localhost:abc'"),
        (["ftp://node7/"], "not an http(s) URL"),
        (["--timeout", "0"], "argument --timeout: must be a number of seconds > 0, got '0'"),
        (["--timeout", "-1"], "argument --timeout: must be a number of seconds > 0, got '-1'"),
        (["--timeout", "inf"], "argument --timeout: must be a number of seconds > 0, got 'inf'"),
        (["--top", "0"], "argument --top: must be an integer 1-1000, got '0'"),
    ],
)
def test_bad_arguments_are_refused_with_exit_status_2(args: list[str], said: str) -> None:
    code, _, err, _ = cli(*args)
    assert code == 2 and "Traceback" not in err and said in err.splitlines()[-1]


def start_on_a_port(**kwargs: Any) -> Any:
    """The exporter on a fixed free port (the token file is named by it); another if it is taken."""
    for _ in range(5):
        try:
            return memexporter.start(port=free_port(), addr="127.0.0.1", strict=True, **kwargs)
        except OSError:
            continue
    raise AssertionError("no free port in 5 attempts")


def test_the_jobs_token_is_found_for_a_local_port(runtime_dir: Path, tmp_path: Path) -> None:
    exp = start_on_a_port(debug=True)
    token = exp.diagnostics.token.value
    (token_file,) = runtime_dir.iterdir()
    for url in (f"127.0.0.1:{exp.port}", f"localhost:{exp.port}", f"http://[::1]:{exp.port}/metrics"):
        if url.startswith("http://[::1]") and not socket.has_ipv6:
            continue
        code, out, err, _ = cli(url.replace("[::1]", "127.0.0.1"), "--timeout", "10")
        assert code == 0 and out.startswith("rank 0, pid "), err
    code, out, _, _ = cli("--print-token-file", f"localhost:{exp.port}")
    assert code == 0 and out.strip() == str(token_file)
    code, _, err, _ = cli(f"127.0.0.1:{exp.port}", env={"XDG_RUNTIME_DIR": str(tmp_path / "nowhere")})
    assert code == 1 and "403, the job wants its debug token and no token file for port" in one_line_error(err)
    assert "--token or MEMEXPORTER_DEBUG_TOKEN" in err and token not in err
    for given in (["--token", token], []):
        code, out, err, _ = cli(
            f"127.0.0.1:{exp.port}",
            *given,
            env={"XDG_RUNTIME_DIR": str(tmp_path / "nowhere"), "MEMEXPORTER_DEBUG_TOKEN": token},
        )
        assert code == 0, err
    code, _, err, _ = cli(f"127.0.0.1:{exp.port}", "--token", "not-the-token-at-all")
    assert code == 1 and "403, the job refused the token given" in one_line_error(err)
    exp.stop()
    assert list(runtime_dir.iterdir()) == []


def _outward_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 9))
            address: str = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_token_file_goes_to_a_loopback_url_only(runtime_dir: Path) -> None:
    runtime_dir.mkdir(mode=0o700)
    hosts = ["127.0.0.1"] + ([a] if (a := _outward_address()) else [])
    for host in hosts:
        seen: list[bytes] = []
        srv = socket.create_server((host, 0))
        port = srv.getsockname()[1]
        (runtime_dir / f"memexporter-{socket.gethostname()}-{os.getpid()}-{port}.token").write_text("t" * 43)

        def once(srv: socket.socket = srv, seen: list[bytes] = seen) -> None:
            conn, _ = srv.accept()
            with conn:
                seen.append(conn.recv(65536))
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

        t = threading.Thread(target=once, daemon=True)
        t.start()
        code, _, err, _ = cli(f"{host}:{port}", "--timeout", "5")
        t.join(10)
        srv.close()
        assert code == 1 and "404" in err and len(seen) == 1
        assert (b"Authorization: Bearer " + b"t" * 43 in seen[0]) is (host == "127.0.0.1"), host
    if len(hosts) == 1:
        pytest.skip("no address besides loopback on this machine: only the loopback half ran")


def dump_of(exp: Any, reason: str) -> dict[str, Any]:
    doc = document(exp.diagnostics.diagnosis, top=1000)
    doc["reason"] = reason
    return doc


def test_a_dump_file_from_oom_dump_dir_reads_as_tables(tmp_path: Path) -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, census_every=2, census_budget=1)

    class Job:
        store: ClassVar[list[Any]] = []

    for _ in range(10):
        memexporter.step()
        Job.store.append(torch.ones(3, 1021))
    dumps = tmp_path / "oom"
    dumps.mkdir()
    old, new = dumps / "memexporter-premortem-rank0-pid11.json", dumps / "memexporter-oom-rank0-pid12-1.json"
    old.write_text(json.dumps(dump_of(exp, "cpu: OOM ETA 120 s (< 300 s)")))
    new.write_text(json.dumps(dump_of(exp, "cuda:0: out of memory asking for 2097152 bytes")))
    os.utime(old, (time.time() - 60, time.time() - 60))
    (dumps / "memexporter-oom-rank0-pid12-1.pickle").write_bytes(b"\x80\x04N.")
    Job.store.clear()
    code, out, err, _ = cli(str(old))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("rank 0, pid ") and "to memexporter-premortem-rank0-pid11.json" in lines[0]
    assert lines[1] == "why: cpu: OOM ETA 120 s (< 300 s)" and "before the dump" in lines[2]
    assert "Job.store (list)" in out and out.index("Growing") < out.index("Census:")
    code, out, _, _ = cli(str(dumps))  # the folder: its newest dump
    assert code == 0 and "why: cuda:0: out of memory asking for 2097152 bytes" in out
    code, out, _, _ = cli(str(old), "--json")
    assert code == 0 and json.loads(out)["reason"].startswith("cpu: OOM ETA")
    code, _, err, _ = cli(str(dumps / "memexporter-oom-rank0-pid12-1.pickle"))
    assert code == 1 and "pytorch.org/memory_viz" in one_line_error(err)
    code, _, err, _ = cli(str(tmp_path / "missing.json"))
    assert code == 1 and "cannot read" in one_line_error(err) and "No such file" in err
    code, _, err, _ = cli(str(tmp_path))
    assert code == 1 and "no memexporter-*.json in this folder" in one_line_error(err)
    (tmp_path / "memexporter-big.json").write_bytes(b" " * (33 << 20))
    code, _, err, _ = cli(str(tmp_path / "memexporter-big.json"))
    assert code == 1 and "larger than 32 MiB" in one_line_error(err)
