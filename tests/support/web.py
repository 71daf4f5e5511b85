"""HTTP GETs of the tests, in one place: a URL's text (``get_text``: ``/metrics``, ``/live.json``,
a server's own metrics), and a status for diagnostics (``http_status``, ``http_ok``: what a
starting process answers while a test waits for it).

``get_answer`` gives the status, Content-Type and body, of an error answer too, as they come (no
``fresh``: a test that needs a snapshot calls ``flush()`` itself), with ``base``, an exporter's root URL
(tests/integration/test_exporter_http.py, test_exporter_lifecycle.py). A test that needs other headers,
another method, or a token keeps its own small ``get`` and says so (test_live_page.py,
test_debug_endpoints.py). Scripts a test runs as a separate interpreter (a training script under
``memexporter run`` or torchrun) read ``/metrics`` with ``urllib`` themselves, as a user's would.

The exporter publishes a snapshot a second (issue 35): a GET of the exporter running in this process
first has it publish (``Exporter.flush()``), so a test reads what it just did, as before."""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

import memexporter
from memexporter import exporter


def get_text(
    url: str, timeout: float = 10.0, *, context: ssl.SSLContext | None = None, headers: Mapping[str, str] | None = None
) -> str:
    """The body of ``GET url``, decoded as UTF-8. An error status raises ``urllib.error.HTTPError``;
    no answer within ``timeout`` seconds raises as ``urllib.request.urlopen`` does."""
    fresh(url)
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
        body: bytes = resp.read()
    return body.decode()


def fresh(url: str) -> None:
    """When ``url`` is the exporter running in this process: publish a snapshot now and wait for it."""
    running = exporter.running()
    if running is not None and running.port is not None and urllib.parse.urlsplit(url).port == running.port:
        running.flush()


def get_answer(
    url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, str, str]:
    """``(status, Content-Type, body)`` of ``GET url``, an error answer's too (an ``HTTPError`` is read, not raised)."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def base(exp: memexporter.Exporter) -> str:
    """The plain-HTTP root URL of an exporter on loopback (``http://127.0.0.1:PORT``)."""
    return f"http://127.0.0.1:{exp.port}"


def http_status(url: str, timeout: float = 2.0) -> str:
    """``"200"``, another status code, or the connection error, for diagnostics."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return str(resp.status)
    except urllib.error.HTTPError as err:
        return str(err.code)
    except (urllib.error.URLError, OSError, ValueError) as err:
        return f"{type(err).__name__}: {getattr(err, 'reason', err)}"


def http_ok(url: str, timeout: float = 2.0) -> bool:
    return http_status(url, timeout) == "200"


def answering(url: str, within: float) -> float:
    """Seconds until ``url`` answers 200 (a restarted helper binds its port again: until then a connection is
    refused); fails the test after ``within`` seconds."""
    began = time.monotonic()
    while not http_ok(url, timeout=0.5):
        waited = time.monotonic() - began
        assert waited < within, f"{url} did not answer within {within:g} s: {http_status(url, 0.5)}"
        time.sleep(0.02)
    return time.monotonic() - began
