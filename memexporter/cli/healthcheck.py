"""``python -m memexporter.healthcheck``: exit 0 when the exporter in this container answers ``/healthz``.

The image's ``HEALTHCHECK`` and the compose stack run it. It reads the exporter's own settings
(``MEMEXPORTER_PORT``, ``MEMEXPORTER_ADDR``, ``MEMEXPORTER_CERTFILE``), so it probes where local
rank 0 serves: a wildcard bind address is probed on loopback, and TLS is used when a certificate
is configured (unverified: this checks liveness on the same host, not identity). It never imports
torch (a probe takes a fraction of a second), and it prints one line saying why it failed.
"""

from __future__ import annotations

import ssl
import sys
import urllib.error
import urllib.request

from memexporter.config import resolve_knob

_WILDCARDS = {"", "0.0.0.0", "::"}


def url(environ: dict[str, str] | None = None) -> str:
    """The ``/healthz`` URL of local rank 0 under the given (default: this process's) environment."""
    port = resolve_knob("port", environ=environ)
    if port == 0:
        raise ValueError("memexporter: MEMEXPORTER_PORT=0 picks a random port; a health check needs a fixed one")
    addr = str(resolve_knob("addr", environ=environ)).strip("[]")
    host = addr
    if addr in _WILDCARDS:  # bound to every interface: loopback is one of them
        host = "::1" if addr == "::" else "127.0.0.1"
    scheme = "https" if resolve_knob("certfile", environ=environ) else "http"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/healthz"


def probe(target: str, timeout: float = 3.0) -> str | None:
    """None when ``target`` answers 200, else the reason."""
    context = ssl._create_unverified_context() if target.startswith("https") else None
    try:
        with urllib.request.urlopen(target, timeout=timeout, context=context) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, timed out, TLS error
        return str(getattr(exc, "reason", exc))


def main() -> int:
    """Probe the exporter at ``url()``: exit 0 when it answers 200, 1 when not (one line on stderr says why),
    2 when the settings give no fixed port or are invalid."""
    try:
        target = url()
    except (TypeError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    reason = probe(target)
    if reason is None:
        return 0
    print(f"memexporter: {target} is not healthy: {reason}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
