"""The /debug endpoints on the started exporter, over real HTTP on loopback (real torch on CPU):
off by default, loopback-only unless allowed, the process's token required (its file in the
runtime dir, never in the log), the JSON schema with a real leak in it, the CUDA snapshot's
answer on a CPU job, and an answer while the training loop is stuck. The token files go to
``tmp_path`` (``XDG_RUNTIME_DIR``)."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import make_wsgi_app
from torch import nn

import memexporter
from memexporter.exporter import running
from memexporter.serving.guard import accepts, guarded
from memexporter.serving.server import Route, router
from memexporter.tracking import boundaries
from tests.support.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_exporter", "runtime_dir")]


def token_of(exp: Any) -> str:
    assert exp.diagnostics is not None and exp.diagnostics.token is not None
    value: str = exp.diagnostics.token.value
    return value


def get(url: str, method: str = "GET", token: str | None = None) -> tuple[int, str, bytes]:
    """``url``, with the running exporter's token unless ``token`` says otherwise ("" for none).
    A 429 (the /debug routes' request rate limit) is waited out, as ``memexporter inspect`` does.
    Not ``tests.support.web.get_text``: the status of an error answer, other methods, the token."""
    if token is None:
        exp = running()
        token = exp.diagnostics.token.value if exp and exp.diagnostics and exp.diagnostics.token else ""
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}"} if token else {})
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read()
        except urllib.error.HTTPError as e:
            if e.code == 429 and time.monotonic() < deadline:
                time.sleep(float(e.headers.get("Retry-After", "1")))
                continue
            return e.code, e.headers.get("Content-Type", ""), e.read()


def call(app: Any, path: str, peer: str, method: str = "GET", token: str = "") -> tuple[str, bytes]:
    """The served WSGI app, called with ``peer`` as the connection's address."""
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen.append(status)

    environ = {"PATH_INFO": path, "REQUEST_METHOD": method, "REMOTE_ADDR": peer, "QUERY_STRING": ""}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    body: Iterable[bytes] = app(environ, start_response)
    return seen[0], b"".join(body)


class Trainer:
    def __init__(self) -> None:
        self.model = nn.Linear(16, 16)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.kept: list[torch.Tensor] = []

    def step(self) -> None:
        self.model(torch.randn(4, 16)).sum().backward()
        self.opt.step()
        self.opt.zero_grad()
        self.kept.append(torch.ones(1, 4099))


def test_off_by_default() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    base = f"http://127.0.0.1:{exp.port}"
    assert get(base + "/debug/memory")[0] == 404
    assert get(base + "/debug/snapshot")[0] == 404
    assert b"debug" not in get(base + "/")[2]
    assert exp.diagnostics is None


def test_memory_document_names_the_growing_group_and_its_holder() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, census_every=2, census_budget=1)
    base = f"http://127.0.0.1:{exp.port}"
    status, ctype, body = get(base + "/debug/memory")
    doc = json.loads(body)
    assert (status, ctype) == (200, "application/json")
    assert doc["census"] is None and doc["growth"] == [] and doc["next_census_step"] == 2
    trainer = Trainer()
    for _ in range(12):
        trainer.step()
    doc = json.loads(get(base + "/debug/memory?top=5")[2])
    assert doc["step"] == 12 and doc["census"]["step"] == 12 and len(doc["census"]["groups"]) == 5
    sizes = [g["bytes"] for g in doc["census"]["groups"]]
    assert sizes == sorted(sizes, reverse=True)
    top = doc["growth"][0]
    assert {k: top[k] for k in ("device", "dtype", "shape", "kind", "count_per_step", "bytes_per_step", "held_by")} == {
        "device": "cpu",
        "dtype": "float32",
        "shape": [1, 4099],
        "kind": "other",
        "count_per_step": 1.0,
        "bytes_per_step": 4099 * 4.0,
        "held_by": ["Trainer.kept (list)"],
    }
    assert doc["oom"]["cpu"]["used_bytes"] > 0 and doc["oom"]["cpu"]["limit_bytes"] > doc["oom"]["cpu"]["used_bytes"]
    landing = get(base + "/")[2]
    assert b'href="debug/memory"' in landing and b'href="debug/snapshot"' in landing
    assert get(base + "/debug/memory", method="HEAD")[:1] == (200,)


@pytest.mark.parametrize(
    ("peer", "allow", "status"),
    [
        ("10.1.2.3", None, "403 Forbidden"),
        ("127.0.0.1", None, "200 OK"),
        ("::1", None, "200 OK"),
        ("::ffff:127.0.0.1", None, "200 OK"),  # an IPv4 peer on a dual-stack socket
        ("10.1.2.3", "10.0.0.0/8", "200 OK"),
        ("10.1.2.3", "192.168.0.0/16, fd00::/8", "403 Forbidden"),
        ("fd00::7", "192.168.0.0/16, fd00::/8", "200 OK"),
        ("", None, "403 Forbidden"),
        ("not-an-address", "0.0.0.0/0", "403 Forbidden"),
    ],
)
def test_peers_outside_loopback_and_the_allowed_networks_get_403(peer: str, allow: str | None, status: str) -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, debug_allow=allow)
    assert exp.diagnostics is not None
    debug = exp.diagnostics.debug()
    assert debug is not None
    # The router as the helper runs it, with the exporter's own debug routes behind their checks, the
    # forwarding to the job replaced by a call of the job's apps.
    routes = {
        path: Route(guarded(app, debug.allow, accepts(debug.token), debug.hint), description, admits=True)
        for path, (app, description) in debug.apps.items()
    }
    app = router(make_wsgi_app(exp.registry), "memexporter", routes)
    for path in ("/debug/memory", "/debug/snapshot"):
        got, body = call(app, path, peer, token=token_of(exp))
        if status.startswith("403"):
            assert got == status and b"MEMEXPORTER_DEBUG_ALLOW" in body
        else:
            assert got != "403 Forbidden"
    assert call(app, "/metrics", peer)[0] == "200 OK"  # /metrics stays open to everyone


def test_snapshot_on_a_cpu_job_says_why_there_is_none() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    status, ctype, body = get(f"http://127.0.0.1:{exp.port}/debug/snapshot")
    assert status == 409 and ctype.startswith("text/plain") and b"no CUDA allocator in use" in body


def test_memory_answers_while_the_training_loop_is_stuck() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, census_every=1, census_budget=1)
    memexporter.step()
    entered, release = threading.Event(), threading.Event()

    def stuck_in_the_step(step: int) -> None:  # the training loop hangs at step 2, after its census
        entered.set()
        release.wait(30)

    assert exp.sources.steps is not None
    exp.sources.steps.add_boundary_callback(stuck_in_the_step)
    stuck = threading.Thread(target=boundaries.step, daemon=True)
    stuck.start()
    try:
        assert entered.wait(30)
        started = time.monotonic()
        status, _, body = get(f"http://127.0.0.1:{exp.port}/debug/memory")
        took = time.monotonic() - started
        assert status == 200 and json.loads(body)["census"]["step"] == 2 and stuck.is_alive()
        assert took < 5, f"/debug/memory took {took:.1f} s while the training loop was stuck"
    finally:
        release.set()
        stuck.join(10)


def test_stop_unhooks_the_census() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, census_every=1)
    diagnostics = exp.diagnostics
    assert diagnostics is not None
    exp.stop()
    memexporter.step()
    assert diagnostics.diagnosis.closed and diagnostics.diagnosis.findings is None


def test_memory_answers_from_the_last_census_while_the_next_one_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    from memexporter.diagnose import census

    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, census_every=1, census_budget=1)
    memexporter.step()
    real_take, entered, release = census.take, threading.Event(), threading.Event()

    def hanging_take(step: int, previous: Any) -> Any:
        entered.set()
        release.wait(30)
        return real_take(step, previous)

    monkeypatch.setattr(census, "take", hanging_take)
    stuck = threading.Thread(target=boundaries.step, daemon=True)
    stuck.start()
    try:
        assert entered.wait(30)
        status, _, body = get(f"http://127.0.0.1:{exp.port}/debug/memory")
        assert status == 200 and json.loads(body)["census"]["step"] == 1 and stuck.is_alive()
    finally:
        release.set()
        stuck.join(10)


def test_a_failing_document_is_a_500_that_says_why_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from memexporter.diagnose import endpoints as http

    def broken(diagnosis: Any, top: int) -> Any:
        raise ValueError("Out of range float values are not JSON compliant")

    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    monkeypatch.setattr(http, "document", broken)
    status, _, body = get(f"http://127.0.0.1:{exp.port}/debug/memory")
    assert status == 500 and b"ValueError: Out of range float" in body
    assert get(f"http://127.0.0.1:{exp.port}/metrics")[0] == 200
    assert "Traceback" not in capfd.readouterr().err  # nothing on the job's stderr per request


def test_the_endpoints_need_the_processs_token_and_metrics_does_not() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    token = token_of(exp)
    base = f"http://127.0.0.1:{exp.port}"
    for path in ("/debug/memory", "/debug/snapshot"):
        status, ctype, body = get(base + path, token="")
        assert (status, ctype) == (403, "text/plain; charset=utf-8") and body.count(b"\n") == 1
        assert b"needs this process's token" in body and b"memexporter inspect" in body and token.encode() not in body
        assert get(base + path, token="x" * len(token))[0] == 403
        assert get(base + path, token=token[:-1])[0] == 403
        assert get(base + path, method="HEAD", token="")[0] == 403
    assert get(base + "/debug/memory", token=token)[0] == 200
    assert get(base + f"/debug/memory?top=3&token={token}", token="")[0] == 200  # the query form, for a browser
    assert get(base + "/debug/snapshot", token=token)[0] == 409  # past the token: a CPU job has no snapshot
    assert get(base + "/metrics", token="")[0] == 200 and get(base + "/healthz", token="")[0] == 200
    while True:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/debug/memory", timeout=10)
        if refused.value.code != 429:
            break
        time.sleep(float(refused.value.headers.get("Retry-After", "1")))
    assert refused.value.code == 403 and refused.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_requests_without_the_token_spend_none_of_the_owners_turns(runtime_dir: Path) -> None:
    # The /debug routes share one request rate (1 a second, 5 at once). Another local user, who
    # has no token, could otherwise keep them at 429 for the job's owner.
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, strict=True)
    base, token = f"http://127.0.0.1:{exp.port}", token_of(exp)
    for _ in range(30):  # a flood without the token: each one refused, none counted
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/debug/memory", timeout=10)
        assert refused.value.code == 403
    req = urllib.request.Request(base + "/debug/memory", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:  # no waiting: the owner's turn is there
        assert r.status == 200


def test_the_token_file_is_the_users_alone_named_by_pid_and_port_and_removed_at_stop(runtime_dir: Path) -> None:
    port = free_port()
    exp = memexporter.start(port=port, addr="127.0.0.1", debug=True, strict=True)
    files = list(runtime_dir.iterdir())
    assert [f.name for f in files] == [f"memexporter-{socket.gethostname()}-{os.getpid()}-{port}.token"]
    assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert files[0].read_text().strip() == token_of(exp)
    assert get(f"http://127.0.0.1:{port}/debug/memory", token=files[0].read_text().strip())[0] == 200
    exp.stop()
    assert list(runtime_dir.iterdir()) == []


def test_the_token_file_follows_the_bound_port(runtime_dir: Path) -> None:
    # Diagnostics.served(port): what the exporter calls once its server is bound (port 0: the
    # port is known only then) or could not bind (None).
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    assert exp.diagnostics is not None and exp.port is not None
    exp.diagnostics.served(exp.port)
    (path,) = runtime_dir.iterdir()
    assert path.name.endswith(f"-{os.getpid()}-{exp.port}.token") and path.read_text().strip() == token_of(exp)
    exp.diagnostics.served(None)
    assert list(runtime_dir.iterdir()) == []


def test_the_token_never_reaches_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="memexporter")
    exp = memexporter.start(port=free_port(), addr="127.0.0.1", debug=True, census_every=1)
    token = token_of(exp)
    base = f"http://127.0.0.1:{exp.port}"
    get(base + "/debug/memory")
    get(base + f"/debug/memory?token={token}x", token="")
    get(base + "/debug/memory", token=token + "x")
    exp.stop()
    assert any("needs this process's token" in r.getMessage() for r in caplog.records)  # the file's path is said
    assert token not in caplog.text and token not in repr(exp.diagnostics.token if exp.diagnostics else None)


def test_a_token_from_the_environment_and_a_short_one_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEXPORTER_DEBUG_TOKEN", "0123456789abcdef-mine")
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    assert get(f"http://127.0.0.1:{exp.port}/debug/memory", token="0123456789abcdef-mine")[0] == 200
    exp.stop()
    monkeypatch.setenv("MEMEXPORTER_DEBUG_TOKEN", "short-secret")
    with pytest.raises(ValueError, match="MEMEXPORTER_DEBUG_TOKEN must be at least 16") as err:
        memexporter.start(port=0, addr="127.0.0.1", debug=True)
    assert "short-secret" not in str(err.value)


@pytest.mark.parametrize(
    ("allow", "warned"),
    [
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("::/0", "::/0"),
        ("10.0.0.0/8, 8.8.8.0/24", "8.8.8.0/24"),
        ("10.0.0.0/7", "10.0.0.0/7"),
        ("10.0.0.0/8, 192.168.0.0/16, fd00::/8", None),
        (None, None),
    ],
)
def test_an_allow_list_open_past_private_networks_is_a_loud_warning(
    allow: str | None, warned: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="memexporter")
    memexporter.start(port=0, addr="127.0.0.1", debug=True, debug_allow=allow)
    said = [r for r in caplog.records if "debug_allow" in r.getMessage() and r.levelno >= logging.WARNING]
    if warned is None:
        assert said == []
    else:
        assert len(said) == 1 and f"debug_allow={warned} opens /debug/*" in said[0].getMessage()


def test_a_cache_keyed_by_a_secret_is_redacted_in_the_document() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, census_every=2, census_budget=1)
    api_key = "sk-proj-Zq81hTfA0pLm4"  # a cache key of 21 characters, not an identifier

    class Runner:
        def __init__(self) -> None:
            self.by_user: dict[str, list[torch.Tensor]] = {api_key: [], "train": []}

    trainer, runner = Trainer(), Runner()
    for _ in range(12):
        trainer.step()
        trainer.kept.clear()
        runner.by_user[api_key].append(torch.ones(1, 4099))
    body = get(f"http://127.0.0.1:{exp.port}/debug/memory")[2]
    assert api_key.encode() not in body and b"sk-proj" not in body
    assert json.loads(body)["growth"][0]["held_by"] == ["Runner.by_user['<redacted 21 chars>'] (list)"]
