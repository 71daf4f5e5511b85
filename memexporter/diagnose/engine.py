"""The diagnosis, driven from the step tracker's boundary on the training thread.

Every ``census_every`` steps (stretched so that the census, with its holder and graph walks,
costs at most ``census_budget`` of the wall time between censuses) it takes a census, finds the
growing groups and the graphs that span steps, names their holders, and publishes one
immutable ``Findings``. Every ``WATCH_INTERVAL_S`` it also reads the in-process leak estimate:
a device whose estimate turns positive gets a census at once (so the holder is named sooner) and,
once a growing group explains it, one log line. The pre-mortem watch (``dumps.py``) rides
on the same tick; its files go through ``writer``, a thread of their own, so a slow or full disk
never holds the training thread. Nothing here raises into training: failures are counted and
logged once, named for what failed.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from memexporter.collectors.scrape import Sources
from memexporter.diagnose import autograd, census, growth, holders
from memexporter.diagnose.findings import Findings, Named, NamedGraph
from memexporter.diagnose.report import estimates
from memexporter.diagnose.words import graph_line, leak_line, unexplained_line
from memexporter.diagnose.writer import DumpWriter

log = logging.getLogger("memexporter")

BUDGET = 0.005
"""Default share of the training wall time the censuses may take (0.5 %; knob ``census_budget``)."""
HISTORY = 16
WATCH_INTERVAL_S = 2.0
NAMED_GROUPS = 5
"""Growing groups whose holders are looked up (fastest first)."""
UNEXPLAINED_AFTER = 3
"""Censuses with a positive leak estimate and no growing group before saying so."""


def next_census(step: int, every: int, budget: float, cost: float, elapsed: float, steps: int, prompt: bool) -> int:
    """The step of the next census: ``every`` steps on, or later so that ``cost`` (seconds) stays
    under ``budget`` of the training wall time per census interval (``elapsed`` seconds over
    ``steps`` steps since the last census, the census included). ``prompt``, or a budget of 1:
    ``every``, whatever the cost. At most ``100 * every`` steps on."""
    per_step = max(1e-9, (elapsed - cost) / max(1, steps))
    needed = 0 if prompt or cost <= 0 or budget >= 1 else math.ceil(cost / (budget * per_step))
    return step + min(max(every, needed), 100 * every)


class Diagnosis:
    """Census scheduling, history and findings for one exporter. ``on_boundary`` is the step
    tracker's callback; ``findings`` is what readers take."""

    def __init__(
        self, sources: Sources, every: int, budget: float = BUDGET, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.sources, self.every, self.budget, self._clock = sources, every, budget, clock
        self.findings: Findings | None = None
        self.next_step = every
        self.errors = 0
        self.closed = False
        self.watchers: list[Callable[[int, float], None]] = []  # run on the watch tick (pre-mortem)
        self.writer = DumpWriter()  # files in oom_dump_dir, written off the training thread
        self._failures_said: set[str] = set()
        self._pid = os.getpid()
        self._history: deque[growth.Point] = deque(maxlen=HISTORY)
        self._costs: deque[tuple[int, int, int, float]] = deque(maxlen=HISTORY)
        self._keys: frozenset[census.StorageKey] | None = None
        self._marks: frozenset[autograd.Mark] = frozenset()
        self._names: dict[Any, tuple[str, ...]] = {}
        self._positive: dict[str, float] = {}  # device -> leak bytes/step while positive
        self._said: set[str] = set()  # devices whose leak was put in words this episode
        self._waiting: dict[str, int] = {}  # device -> censuses since positive, unexplained
        self._graphs_said = False
        self._last_watch = -math.inf
        self._mark: tuple[int, float] | None = None  # (step, time) after the last census

    # --- training thread -----------------------------------------------------------------------

    def on_boundary(self, step: int) -> None:
        """The step tracker's boundary callback (training thread). Never raises."""
        if self.closed or os.getpid() != self._pid:
            return
        watch, now = False, 0.0
        try:
            now = self._clock()
            if self._mark is None:
                self._mark = (step, now)
            watch = now - self._last_watch >= WATCH_INTERVAL_S
            if watch:
                self._last_watch = now
            if watch and self._watch_leak():
                # A leak just showed: census now, and once more after the ordinary interval
                # whatever the budget says, so the growing group is named two censuses later.
                self.take(step, "the leak estimate turned positive", prompt=True)
            elif step >= self.next_step:
                self.take(step)
        except Exception:
            self._failed("the tensor census")
        if watch:
            for watcher in self.watchers:
                try:
                    watcher(step, now)
                except Exception:
                    self._failed(getattr(watcher, "what", "a diagnosis watcher"))

    def _watch_leak(self) -> bool:
        """Refresh the positive devices; True when one just turned positive (census it now)."""
        positive = {d: e.leak_bytes_per_step for d, e in estimates(self.sources).items() if e.leak_bytes_per_step > 0}
        turned = bool(set(positive) - set(self._positive))
        for device in set(self._positive) - set(positive):  # back to flat: a new episode may be said
            self._said.discard(device)
            self._waiting.pop(device, None)
        self._positive = positive
        return turned

    def take(self, step: int, reason: str = "", prompt: bool = False) -> Findings:
        """Take a census now, analyse it and publish the findings (training thread). ``prompt``:
        the next census comes after ``every`` steps, not later, whatever the budget."""
        started = self._clock()
        self.next_step = step + self.every  # a census that fails is not retried at every step
        scan = census.take(step, self._keys)
        self._keys = scan.keys
        self._history.append(growth.Point(step, scan.census.counts(), scan.census.left_out == 0))
        grown = growth.find_growth(list(self._history), frozenset(self._positive))
        graphs, graph_samples, self._marks = autograd.inspect_graphs(scan.graph_roots, self._marks)
        named = self._name(scan, grown[:NAMED_GROUPS], graph_samples)
        scan.samples.clear()
        scan.graph_roots.clear()
        graph_samples.clear()
        cost = self._clock() - started
        self._schedule(step, cost, prompt)
        self._costs.append((step, scan.census.bytes, scan.census.storages, cost))
        findings = Findings(
            census=scan.census,
            growth=tuple(Named(g, named.get(g.key, ())) for g in grown),
            graphs=tuple(
                NamedGraph(g, named.get(("graph", g.device, g.dtype, g.shape, g.grad_fn), ())) for g in graphs
            ),
            history=tuple(self._costs),
            next_census_step=self.next_step,
            cost_s=cost,
            reason=reason,
        )
        self.findings = findings
        self._say(findings)
        return findings

    def _name(
        self, scan: census.Scan, grown: list[growth.Growth], graph_samples: dict[Any, list[Any]]
    ) -> dict[Any, tuple[str, ...]]:
        """Holder names per growing group and spanning graph; re-walked every 4th census only."""
        wanted: list[tuple[Any, list[Any]]] = []
        refresh = len(self._history) % 4 == 0
        for g in grown:
            if refresh or not self._names.get(g.key):
                wanted.append((g.key, scan.samples.get(g.key, [])))
        for (device, dtype, shape, fn), picks in graph_samples.items():
            key = ("graph", device, dtype, shape, fn)
            if refresh or not self._names.get(key):
                wanted.append((key, picks))
        flat = [t for _, picks in wanted for t in picks]
        if flat:
            ignore: list[object] = [
                scan,
                scan.samples,
                scan.graph_roots,
                graph_samples,
                wanted,
                flat,
                *scan.samples.values(),
                *graph_samples.values(),
            ]
            names = holders.find_holders(flat, ignore)
            i = 0
            for key, picks in wanted:
                votes = Counter(n for found in names[i : i + len(picks)] for n in found)
                self._names[key] = tuple(n for n, _ in votes.most_common(3))
                i += len(picks)
        keep = {g.key for g in grown} | {("graph", *k) for k in graph_samples}
        self._names = {k: v for k, v in self._names.items() if k in keep}
        return dict(self._names)

    def _schedule(self, step: int, cost: float, prompt: bool) -> None:
        assert self._mark is not None
        last_step, last_t = self._mark
        now = self._clock()
        self.next_step = next_census(step, self.every, self.budget, cost, now - last_t, step - last_step, prompt)
        self._mark = (step, now)

    def _say(self, f: Findings) -> None:
        """One log line per leak episode per device, and one for graphs spanning steps."""
        for device, rate in self._positive.items():
            if device in self._said:
                continue
            top = next((n for n in f.growth if n.growth.key[0] == device), None)
            if top is not None:
                log.warning(leak_line(device, rate, top))
                self._said.add(device)
                continue
            self._waiting[device] = self._waiting.get(device, 0) + 1
            if self._waiting[device] >= UNEXPLAINED_AFTER:
                log.warning(unexplained_line(device, rate))
                self._said.add(device)
        if f.graphs and not self._graphs_said:
            log.warning(graph_line(f.graphs[0], sum(g.graph.count for g in f.graphs)))
            self._graphs_said = True

    def _failed(self, what: str) -> None:
        self.errors += 1
        if what not in self._failures_said:
            self._failures_said.add(what)
            log.exception("memexporter: %s failed; counting further failures silently", what)

    def close(self) -> None:
        """Stop taking censuses (the exporter stopped). The findings stay readable; files handed
        to the writer are still written."""
        self.closed = True
        self.writer.close()
