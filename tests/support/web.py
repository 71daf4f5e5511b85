"""HTTP GETs of the tests, in one place: a URL's text (``get_text``: ``/metrics``, ``/live.json``,
a server's own metrics), and a status for diagnostics (``http_status``, ``http_ok``: what a
starting process answers while a test waits for it).

A test that needs the status and headers of an error answer, another method, or a token keeps
its own small ``get`` and says so (tests/integration/test_exporter_http.py, test_live_page.py,
test_debug_endpoints.py). Scripts a test runs as a separate interpreter (a training script under
``memexporter run`` or torchrun) read ``/metrics`` with ``urllib`` themselves, as a user's would."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping


def get_text(
    url: str, timeout: float = 10.0, *, context: ssl.SSLContext | None = None, headers: Mapping[str, str] | None = None
) -> str:
    """The body of ``GET url``, decoded as UTF-8. An error status raises ``urllib.error.HTTPError``;
    no answer within ``timeout`` seconds raises as ``urllib.request.urlopen`` does."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
        body: bytes = resp.read()
    return body.decode()


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
