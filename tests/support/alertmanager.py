"""A real Alertmanager and a webhook receiver that records what it is sent.

with WebhookReceiver() as hook, running_alertmanager(webhook_url=hook.url) as am:
    ...  # point Prometheus at am.url
    hook.wait_for(lambda p: p["status"] == "firing", timeout=60)
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.process import start_on_free_port, tail
from tests.support.prometheus import http_json


@dataclass(frozen=True)
class Received:
    """One notification: when it arrived (``time.time()``), the request path and the JSON body."""

    time: float
    path: str
    payload: dict[str, Any]


@dataclass
class AlertRelay:
    """An HTTP relay on ``127.0.0.1`` (free port) in front of an Alertmanager, for one evaluator: it forwards
    each request and notes the label sets of the alerts Alertmanager accepted through it (``accepted``).

    Alertmanager's own list shows only an alert's last sender (its ``generatorURL``): where two evaluators
    resend a second apart, the later one's update hides the other's within milliseconds, and a test that
    polled the list saw one of them for 30 s (issue 40). The relay sees every update."""

    target: str  # Alertmanager's base URL
    accepted: set[frozenset[tuple[str, str]]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "AlertRelay is not running; use it as a context manager"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> AlertRelay:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                request = urllib.request.Request(
                    relay.target.rstrip("/") + self.path,
                    data=body,
                    method=self.command,
                    headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as resp:
                        status, answer = resp.status, resp.read()
                except urllib.error.HTTPError as err:
                    status, answer = err.code, err.read()
                if body and self.command == "POST" and 200 <= status < 300:
                    with contextlib.suppress(ValueError, TypeError, AttributeError), relay._lock:
                        relay.accepted.update(frozenset(alert["labels"].items()) for alert in json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = _forward

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="alert-relay", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def took(self, labels: frozenset[tuple[str, str]]) -> bool:
        """Whether Alertmanager accepted an update of the alert ``labels`` through this relay."""
        with self._lock:
            return labels in self.accepted


@dataclass
class WebhookReceiver:
    """An HTTP server on ``127.0.0.1`` (free port) in a thread, recording each POSTed JSON body."""

    received: list[Received] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "WebhookReceiver is not running; use it as a context manager"
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def __enter__(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = json.loads(body)
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._cond:
                    receiver.received.append(Received(time.time(), self.path, payload))
                    receiver._cond.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def payloads(self) -> list[dict[str, Any]]:
        with self._cond:
            return [r.payload for r in self.received]

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> Received:
        """The first notification whose payload satisfies ``predicate``; ``TimeoutError`` listing
        what did arrive otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for r in self.received:
                    if predicate(r.payload):
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(r.payload.get("status"), r.payload.get("groupLabels")) for r in self.received]
                    raise TimeoutError(f"no matching notification in {timeout:.0f} s; received {seen}")
                self._cond.wait(left)


def webhook_config(webhook_url: str, group_by: tuple[str, ...] = ("alertname",)) -> dict[str, Any]:
    """Route every alert to ``webhook_url`` quickly (group_wait 1s, group_interval 1s): for tests."""
    return {
        "route": {
            "receiver": "webhook",
            "group_by": list(group_by),
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }


EXAMPLE = REPO_ROOT / "alertmanager" / "alertmanager.example.yml"
# The example's placeholder receivers, and the path each gets on a test's webhook.
PLACEHOLDERS = {"http://pager.example.invalid/memexporter": "pager", "http://chat.example.invalid/memexporter": "chat"}


def routed_example(folder: Path, webhook_url: str) -> Path:
    """``folder/alertmanager.yml``: the shipped routing example byte for byte, but for its two
    placeholder receiver URLs, which point at ``webhook_url`` (``.../pager`` and ``.../chat``)."""
    text = EXAMPLE.read_text(encoding="utf-8")
    for placeholder, path in PLACEHOLDERS.items():
        assert placeholder in text, f"the example no longer has the {placeholder} placeholder"
        text = text.replace(placeholder, webhook_url.rstrip("/") + "/" + path)
    out = folder / "alertmanager.yml"
    out.write_text(text, encoding="utf-8")
    return out


@dataclass
class Alertmanager:
    """A running server. ``url`` has no trailing slash; ``workdir`` holds config, data and log."""

    url: str
    workdir: Path
    proc: subprocess.Popen[bytes]

    @property
    def log(self) -> str:
        return tail(self.workdir / "alertmanager.log")

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``; ``filters`` become ``filter=name="value"`` matchers."""
        query = "&".join(f'filter={k}="{v}"' for k, v in filters.items())
        return list(http_json(f"{self.url}/api/v2/alerts" + (f"?{query}" if query else "")))

    def status(self) -> dict[str, Any]:
        return dict(http_json(f"{self.url}/api/v2/status"))


@contextlib.contextmanager
def running_alertmanager(
    config: Path | Mapping[str, Any] | None = None,
    webhook_url: str | None = None,
    startup_timeout: float = 60.0,
) -> Iterator[Alertmanager]:
    """Run the real Alertmanager on a free loopback port with storage in a temporary folder and
    clustering off (``--cluster.listen-address=``; otherwise it binds 9094).

    ``config`` is a config file (``alertmanager/alertmanager.example.yml``, say), or a dict written as
    YAML; with neither, ``webhook_url`` gets every alert (``webhook_config``).
    """
    binary = require("alertmanager")
    if config is None:
        if webhook_url is None:
            raise ValueError("running_alertmanager needs a config or a webhook_url")
        config = webhook_config(webhook_url)
    with tempfile.TemporaryDirectory(prefix="memexporter-alertmanager-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        if isinstance(config, Path):
            config_file = config.resolve()
        else:
            config_file = workdir / "alertmanager.yml"
            config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
        port, proc = start_on_free_port(
            stack,
            lambda port: [
                binary,
                f"--config.file={config_file}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            "/-/ready",
            workdir / "alertmanager.log",
            what="alertmanager",
            timeout=startup_timeout,
        )
        yield Alertmanager(f"http://127.0.0.1:{port}", workdir, proc)
