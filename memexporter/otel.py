"""OpenTelemetry adapter: the same collectors, as observable instruments.

    from opentelemetry.sdk.metrics import MeterProvider
    exp = memexporter.start()
    bridge = memexporter.otel.instrument(exp, meter_provider=my_provider)

One instrument per row of the spec table (``MetricSpec.otel_name``, its unit in UCUM, its HELP
as description); nothing is written twice. Library etiquette: it takes the caller's
``MeterProvider``, falls back to the global one, and never calls ``set_meter_provider``. CUDA-only
instruments are created only when a CUDA device is in use when ``instrument()`` runs (a
capability probed once, as the OTel system-metrics instrumentation does). OpenTelemetry has no
+Inf, so ``memexporter.oom.eta`` has no data point while memory is not growing. Needs the
``opentelemetry-api`` package (``pip install memexporter[otel]``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from memexporter import __version__
from memexporter.exporter import Exporter, running
from memexporter.metrics import SPECS, MetricSpec

# Prometheus base units -> UCUM, as OpenTelemetry semantic conventions spell them.
UCUM = {"bytes": "By", "seconds": "s", "ratio": "1", "bytes_per_second": "By/s", "bytes_per_step": "By/{step}", "": "1"}

# One registry walk serves every instrument's callback within one export cycle.
CYCLE_SECONDS = 1.0


class OtelBridge:
    """Observable instruments over an exporter's collectors. ``close()`` silences them."""

    def __init__(self, exporter: Exporter, meter: Any, include_cuda: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._exporter, self._clock = exporter, clock
        self._lock = threading.Lock()
        self._cache: tuple[float, dict[str, list[tuple[dict[str, str], float]]]] | None = None
        self._closed = False
        self.instruments: dict[str, Any] = {}
        for spec in SPECS:
            if spec.cuda_only and not include_cuda:
                continue
            make = meter.create_observable_counter if spec.type == "counter" else meter.create_observable_gauge
            self.instruments[spec.otel_name] = make(
                spec.otel_name, callbacks=[self._callback(spec)], unit=UCUM.get(spec.unit, "1"), description=spec.help,
            )

    def _samples(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        with self._lock:
            now = self._clock()
            if self._cache is None or now - self._cache[0] > CYCLE_SECONDS:
                out: dict[str, list[tuple[dict[str, str], float]]] = {}
                for family in self._exporter.registry.collect():
                    for s in family.samples:
                        out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
                self._cache = (now, out)
            return self._cache[1]

    def _callback(self, spec: MetricSpec) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def observe(options: Any) -> Iterable[Any]:
            if self._closed:
                return
            for labels, value in self._samples().get(spec.name, []):
                # OpenTelemetry rejects non-finite values: an ETA of +Inf ("not growing") is
                # reported as no data point rather than logged as an error every cycle.
                if math.isfinite(value):
                    yield Observation(value, labels)

        return observe

    def close(self) -> None:
        """Stop reporting (OpenTelemetry has no way to delete an instrument)."""
        self._closed = True


def instrument(exporter: Exporter | None = None, meter_provider: Any = None) -> OtelBridge:
    """Publish ``exporter``'s metrics (default: the running one) through OpenTelemetry."""
    from opentelemetry import metrics as otel_metrics

    exp = exporter or running()
    if exp is None:
        raise ValueError("memexporter.otel.instrument: no exporter; call memexporter.start() first or pass one")
    provider = meter_provider or otel_metrics.get_meter_provider()
    meter = provider.get_meter("memexporter", __version__)
    return OtelBridge(exp, meter, include_cuda=bool(exp.sources.cuda.cuda_devices()))
