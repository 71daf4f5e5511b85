"""OpenTelemetry: the exporter's metrics as observable instruments, pushed over OTLP.

Turned on by ``start()``, never by hand::

    memexporter.start(otel=True)                 # or MEMEXPORTER_OTEL=1: OTLP push from OTEL_* variables
    memexporter.start(meter_provider=provider)   # the application's provider (never set as the global one)
    memexporter.start(otel=True, http=False)     # push only: no port opened

``stop()`` pushes a last time and shuts down a provider memexporter created, and silences the
instruments on one it did not. The instruments and their names come from the spec table
(``names.py``); the bridge is in ``bridge.py``, the provider built from the environment in
``sdk.py``. Needs ``pip install 'memexporter[otel]'`` (``[otel-grpc]`` for gRPC).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Any

from memexporter._version import __version__
from memexporter.collectors.scrape import Identity
from memexporter.otel import sdk
from memexporter.otel.bridge import OtelBridge, Source
from memexporter.otel.names import SCHEMA_URL

__all__ = ["OtelHandle", "attach"]

log = logging.getLogger("memexporter")

# The most stop() (or interpreter exit) waits for the last push: a job must not hang on an
# unreachable collector (the SDK's own default is 30 s).
SHUTDOWN_TIMEOUT_MS = 5_000


class OtelHandle:
    """What ``start()`` set up for OpenTelemetry. ``shutdown()`` undoes it; idempotent."""

    def __init__(self, bridge: OtelBridge, push: sdk.Push | None = None) -> None:
        self.bridge, self.push = bridge, push
        self._lock = threading.Lock()
        self._done = False
        self._pid = os.getpid()

    def shutdown(self) -> None:
        with self._lock:
            if self._done or os.getpid() != self._pid:
                return
            self._done = True
        if self.push is not None:
            atexit.unregister(self.shutdown)
            try:
                if self.push.exporter.failing:  # no last push to a collector that is not answering
                    self.push.exporter.shutdown()
                # Collects and pushes once more (fresh values), then stops the reader's thread.
                self.push.provider.shutdown(timeout_millis=SHUTDOWN_TIMEOUT_MS)
            except Exception as exc:
                log.warning("memexporter: shutting down the OTLP push to %s: %s", self.push.target, exc)
        self.bridge.close()


# One bridge per provider, for the life of the provider: start() after stop() on the application's
# provider must report through the instruments the first start() created.
_bridges: weakref.WeakKeyDictionary[Any, OtelBridge] = weakref.WeakKeyDictionary()


def _bridge(provider: Any, source: Source) -> OtelBridge:
    bridge = _bridges.get(provider)
    if bridge is None:
        bridge = OtelBridge(source, provider.get_meter("memexporter", __version__, schema_url=SCHEMA_URL))
        _bridges[provider] = bridge
    else:
        bridge.reopen(source)
    return bridge


def attach(
    source: Source, ident: Identity, *, push: bool, meter_provider: Any = None, strict: bool = False
) -> OtelHandle | None:
    """Instruments over ``source`` on ``meter_provider``, or on a new OTLP-pushing provider when
    ``push``. A push that cannot be set up is logged in one line (naming the variable, its value
    and the fix) and gives ``None``, unless ``strict``, which raises ``sdk.OtelSetupError``."""
    if meter_provider is not None:
        return OtelHandle(_bridge(meter_provider, source))
    if not push:
        return None
    if sdk.disabled(os.environ):
        log.warning("memexporter: OTEL_SDK_DISABLED=true, so no OTLP push (MEMEXPORTER_OTEL is ignored)")
        return None
    try:
        made = sdk.push_from_environment(ident)
    except sdk.OtelSetupError as exc:
        if strict:
            raise
        log.error("memexporter: %s. No OTLP push; training goes on.", exc)
        return None
    handle = OtelHandle(_bridge(made.provider, source), made)
    atexit.register(handle.shutdown)  # the last push of a job that never calls stop()
    log.info(
        "memexporter: pushing metrics over OTLP (%s) to %s every %g s", made.protocol, made.target, made.interval_s
    )
    return handle
