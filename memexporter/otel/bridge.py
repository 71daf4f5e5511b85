"""Observable OpenTelemetry instruments over the exporter's registry: the same collectors, pushed.

Every instrument of ``names.instruments()`` is created up front, CUDA ones included: an
instrument with nothing to report (no device in use yet) yields no data point, and starts
reporting once the collectors see a device, so a job that calls ``start()`` before
``model.cuda()`` still pushes its allocator and device figures.

One registry walk serves every instrument in one collection: a walk is reused until an
instrument asks a second time, which starts the next collection (no clock involved, and a View
that drops some instruments cannot leave the others stale).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client.core import Metric

from memexporter.otel.names import Instrument, instruments

log = logging.getLogger("memexporter")

Samples = dict[str, list[tuple[dict[str, str], float]]]
INFO = "memexporter_device_info"


class Source(Protocol):
    """What the bridge reads: a prometheus_client registry (or anything with ``collect()``)."""

    def collect(self) -> Iterable[Metric]: ...


class OtelBridge:
    """The instruments on ``meter``, reading ``source``. ``close()`` silences them for good."""

    def __init__(self, source: Source, meter: Any) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._walk: Samples | None = None
        self._asked: set[str] = set()
        self._pid = os.getpid()
        self._closed = False
        self._warned = False
        makers: dict[str, Callable[..., Any]] = {
            "counter": meter.create_observable_counter,
            "gauge": meter.create_observable_gauge,
            "updowncounter": meter.create_observable_up_down_counter,
        }
        self.instruments: dict[str, Any] = {
            i.name: makers[i.kind](i.name, callbacks=[self._callback(i)], unit=i.unit, description=i.spec.help)
            for i in instruments()
        }

    def close(self) -> None:
        """Stop reporting: OpenTelemetry cannot delete an instrument, so its callback yields nothing."""
        self._closed = True

    def reopen(self, source: Source) -> None:
        """Report ``source`` again, on the same instruments: a meter hands back the instruments it
        already has (with their first callbacks) when asked for the same names a second time."""
        with self._lock:
            self._source, self._walk, self._closed = source, None, False

    def _samples(self, instrument: str) -> Samples:
        with self._lock:
            if self._walk is None or instrument in self._asked:
                self._walk, self._asked = self._collect(), set()
            self._asked.add(instrument)
            return self._walk

    def _collect(self) -> Samples:
        out: Samples = {}
        try:
            for family in self._source.collect():
                for s in family.samples:
                    out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        except Exception:  # the registry guards each collector; this is a last resort, logged once
            if not self._warned:
                self._warned = True
                log.exception("memexporter: reading the registry for OpenTelemetry failed")
        return out

    def _callback(self, inst: Instrument) -> Callable[[Any], Iterator[Any]]:
        from opentelemetry.metrics import Observation

        def observe(options: Any) -> Iterator[Any]:
            # A forked child (a DataLoader worker whose SDK thread restarted) reports nothing.
            if self._closed or os.getpid() != self._pid:
                return
            walk = self._samples(inst.name)
            for attributes, value in _points(inst, walk):
                # OpenTelemetry has no +Inf (the SDK drops it with a warning every cycle): an ETA
                # of +Inf ("not growing") is no data point.
                if math.isfinite(value):
                    yield Observation(value, attributes)

        return observe


def _points(inst: Instrument, walk: Samples) -> Iterator[tuple[dict[str, str], float]]:
    rows = walk.get(inst.spec.name, [])
    if inst.semconv is None:
        yield from rows
    elif inst.semconv.attributes == "process":
        for _, value in rows:
            yield {}, value
    else:  # "hw.gpu": hw.id is required, so a device whose UUID is unknown has no point
        info = {(r.get("rank"), r.get("device")): r for r, _ in walk.get(INFO, [])}
        for labels, value in rows:
            ident = info.get((labels.get("rank"), labels.get("device")))
            if ident and ident.get("uuid"):
                # hw.name and hw.vendor are recommended, not required: only when known.
                extra = {
                    k: ident[label] for k, label in (("hw.name", "name"), ("hw.vendor", "vendor")) if ident.get(label)
                }
                yield {"hw.id": ident["uuid"], "hw.type": "gpu", **extra}, value
