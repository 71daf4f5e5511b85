"""``/metrics``: the registry in the scraper's format, rendered fresh unless the server is busy.

What prometheus_client's ``make_wsgi_app`` does (text, or OpenMetrics when ``Accept`` asks for
it; gzip when ``Accept-Encoding`` allows; ``?name[]=a&name[]=b`` keeps only the samples named),
plus a cache of the last answer per variant (format x gzip x names, ``VARIANTS`` of them).

A request gets a fresh render, so a scrape right after a step sees that step, unless the
server's CPU budget has been in debt in the last ``REUSE_FOR`` seconds (a flood): then it gets
its variant's last render while that is younger than ``REUSE_FOR``. Under a flood each variant is thus rendered (and gzipped) at most
once per ``REUSE_FOR``, and a scraper still gets data at most that old. A render that began
after a request arrived serves it too (concurrent scrapes share it).

prometheus_client's own ``name[]`` path (``restricted_registry``) finds nothing here: it looks
collectors up by the names their ``describe()`` gave at registration, and ours describes nothing
(describing would collect, and touch the GPU, at ``start()``). So the samples are filtered here.
"""

from __future__ import annotations

import copy
import gzip
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from memexporter.serving.budget import Budget

REUSE_FOR = 0.5  # seconds a render may serve a busy server's scrapers (below a 1 s scrape interval)
VARIANTS = 8  # renders kept: format x gzip x name[] filter

Key = tuple[str, bool, frozenset[str] | None]


@dataclass(frozen=True)
class Render:
    """One cached render of a variant: when it began (monotonic seconds), its headers, and its body (gzipped
    when the variant is)."""

    started: float  # monotonic seconds
    headers: list[tuple[str, str]]
    body: bytes


class _Only:
    """``registry`` restricted to the samples named (prometheus_client's ``name[]`` semantics)."""

    def __init__(self, registry: Collector, names: frozenset[str]) -> None:
        self._registry, self._names = registry, names

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if s.name in self._names]
            if samples:
                kept = copy.copy(family)
                kept.samples = samples
                yield kept


class Exposition:
    """The ``/metrics`` WSGI app over ``registry``; ``budget`` says whether the server is busy.

    ``encode`` (with its ``content_type``) renders the registry another way, through the same
    cache and budget: the live page's ``/live.json`` (``serving/live.py``).
    """

    def __init__(
        self,
        registry: Collector,
        budget: Budget,
        clock: Callable[[], float] = time.monotonic,
        encode: Callable[[Collector], bytes] | None = None,
        content_type: str = "application/json",
    ) -> None:
        self._registry, self._budget, self._clock = registry, budget, clock
        self._encode, self._content_type = encode, content_type
        self._lock = threading.Lock()  # one render at a time: the GIL would serialise them anyway
        self._renders: OrderedDict[Key, Render] = OrderedDict()
        self.renders = 0  # renders made (for tests and benchmarks)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        arrived = self._clock()
        encoder, content_type = choose_encoder(str(environ.get("HTTP_ACCEPT") or ""))
        if self._encode is not None:
            encoder, content_type = self._encode, self._content_type
        gzipped = gzip_accepted(str(environ.get("HTTP_ACCEPT_ENCODING") or ""))
        names = parse_qs(str(environ.get("QUERY_STRING") or "")).get("name[]")
        key: Key = (content_type, gzipped, frozenset(names) if names is not None else None)
        with self._lock:
            render = self._renders.get(key)
            if render is None or not self._reusable(render, arrived):
                render = self._render(key, encoder)
                self._renders[key] = render
                while len(self._renders) > VARIANTS:
                    self._renders.popitem(last=False)
            self._renders.move_to_end(key)
        start_response("200 OK", render.headers)
        return [render.body]

    def _reusable(self, render: Render, arrived: float) -> bool:
        if render.started > arrived:  # began after this request came: as fresh as a new one
            return True
        return self._clock() - render.started < REUSE_FOR and self._budget.busy(REUSE_FOR)

    def _render(self, key: Key, encoder: Callable[[Any], bytes]) -> Render:
        content_type, gzipped, names = key
        started = self._clock()
        body = encoder(self._registry if names is None else _Only(self._registry, names))
        headers = [("Content-Type", content_type)]
        if gzipped:
            body = gzip.compress(body, compresslevel=6)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        self.renders += 1
        return Render(started, headers, body)
