"""A webhook receiver that logs every Alertmanager notification on one line, for the compose stack.

    python webhook.py [--port 80]          # serve: POST any path with Alertmanager's webhook JSON
    python webhook.py --check [--port 80]  # health check: exit 0 when the server answers GET /healthz

One line per alert in each notification, on stdout (``docker compose logs -f webhook``):

    2026-01-01T12:00:00Z training-pager  firing   MemexporterOOMImminent (critical) rank 0 cuda:0: Training memory ...

Standard library only: it runs in the memexporter image (or any Python 3.10+). Bodies are capped
and malformed ones answered 400, so a stray client cannot make it hold memory or stop logging.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 1 << 20  # Alertmanager batches at most a few hundred alerts per notification


def lines(payload: dict[str, Any]) -> list[str]:
    """The log lines for one webhook payload (Alertmanager's webhook_config JSON, version 4)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    receiver = str(payload.get("receiver", "?"))
    out = []
    for alert in payload.get("alerts", []):
        labels, annotations = alert.get("labels", {}), alert.get("annotations", {})
        where = " ".join(v for v in (f"rank {labels['rank']}" if "rank" in labels else "", labels.get("device", "")) if v)
        out.append(f"{stamp} {receiver:15s} {alert.get('status', '?'):8s} {labels.get('alertname', '?')} "
                   f"({labels.get('severity', '-')}) {where}: {annotations.get('summary', '')}")
    return out


# One notification per line: requests are served on threads, and print() writes the line and its
# newline separately, so two notifications arriving together (a page and a chat message flushed at
# the same group_wait) could otherwise share a line.
_PRINT = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    timeout = 10  # seconds per socket operation: a client that stalls is dropped

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self.send_error(411 if length == 0 else 413 if length > MAX_BODY else 400)
            return
        try:
            payload = json.loads(self.rfile.read(length))
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
            text = lines(payload)
        except (ValueError, AttributeError, TypeError) as exc:
            self.send_error(400, f"not an Alertmanager webhook payload: {exc}")
            return
        with _PRINT:
            for line in text:
                print(line, flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        body = b"ok\n"
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per alert is the whole output


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up before its answer is written (a reset, a timeout) is not worth a
        traceback in the notification log; anything else is one line, not socketserver's dump."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            print(f"webhook receiver: request from {client_address[0]} failed: {exc!r}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Log Alertmanager webhook notifications, one line per alert.")
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--addr", default="0.0.0.0")
    parser.add_argument("--check", action="store_true", help="probe a running receiver's /healthz and exit")
    args = parser.parse_args(argv)
    if args.check:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/healthz", timeout=3) as response:
                return 0 if response.status == 200 else 1
        except OSError as exc:
            print(f"webhook receiver not answering on port {args.port}: {exc}", file=sys.stderr)
            return 1
    server = Server((args.addr, args.port), Handler)
    print(f"webhook receiver listening on {args.addr}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
