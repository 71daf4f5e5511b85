"""OTLP receivers for tests: what a Collector or Prometheus' OTLP receiver gets from memexporter.

``OtlpHttpReceiver`` is a small HTTP server on a free loopback port (bound to port 0 by the
kernel, so parallel tests never collide) that decodes the official ``opentelemetry-proto``
``ExportMetricsServiceRequest`` from ``POST /v1/metrics`` (gzip and deflate bodies included, as
``OTEL_EXPORTER_OTLP_COMPRESSION`` sends them) and answers as the OTLP/HTTP spec says.
``OtlpGrpcReceiver`` serves the same messages over gRPC. Both keep every request with its
arrival time and headers.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric


@dataclass(frozen=True)
class Received:
    """One export request: when it arrived (``time.time()``), its headers, the decoded message."""

    at: float
    headers: dict[str, str]
    request: ExportMetricsServiceRequest


def value_of(v: AnyValue) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def resource(r: Received) -> dict[str, object]:
    """The resource attributes of the (single) resource in a request."""
    (rm,) = r.request.resource_metrics
    return {a.key: value_of(a.value) for a in rm.resource.attributes}


def metrics(r: Received) -> dict[str, Metric]:
    """``{instrument name: Metric}`` of every scope in a request."""
    return {m.name: m for rm in r.request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def points(m: Metric) -> list[tuple[dict[str, object], float]]:
    """``[(attributes, value)]`` of a gauge or sum."""
    data = getattr(m, m.WhichOneof("data"))
    return [
        ({a.key: value_of(a.value) for a in p.attributes}, p.as_double if p.HasField("as_double") else float(p.as_int))
        for p in data.data_points
    ]


@dataclass
class _Store:
    received: list[Received] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def add(self, r: Received) -> None:
        with self.cond:
            self.received.append(r)
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout: float, what: str) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate(self.received):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"OTLP receiver: {what} not seen within {timeout:.0f} s "
                        f"({len(self.received)} requests received)"
                    )
                self.cond.wait(left)
            return list(self.received)

    def snapshot(self) -> list[Received]:
        with self.cond:
            return list(self.received)


def _decode_body(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    return body


class OtlpHttpReceiver(_Store):
    """OTLP/HTTP (binary protobuf) on ``http://127.0.0.1:<port>``; ``endpoint`` is the base URL."""

    def __init__(self) -> None:
        super().__init__()
        store = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = _decode_body(self.rfile.read(length), self.headers.get("Content-Encoding", ""))
                if self.path != "/v1/metrics" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(404 if self.path != "/v1/metrics" else 415)
                    return
                request = ExportMetricsServiceRequest.FromString(body)
                store.add(Received(time.time(), {k.lower(): v for k, v in self.headers.items()}, request))
                reply = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:  # keep the test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpHttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def grpc_receiver() -> Iterator[tuple[str, _Store]]:
    """An OTLP/gRPC receiver on a free loopback port: ``(endpoint, store)``."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

    store = _Store()

    class Service(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
        def Export(self, request: ExportMetricsServiceRequest, context: Any) -> ExportMetricsServiceResponse:
            store.add(Received(time.time(), dict(context.invocation_metadata()), request))
            return ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", store
    finally:
        server.stop(grace=None)
