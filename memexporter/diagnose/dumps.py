"""Files in ``oom_dump_dir``: the pre-mortem (any device) and the CUDA OOM snapshot.

- **Pre-mortem.** On the diagnosis' watch tick (training thread), when a device's OOM ETA drops
  under ``PREMORTEM_ETA_S`` or its use passes ``PREMORTEM_UTILISATION`` of its limit, a fresh
  census is taken and the whole ``/debug/memory`` document is written, once per process. It is
  written before the OOM, so it survives the OOM killer's SIGKILL. A write that fails (a full,
  read-only or foreign directory) is one line naming the write and the reason, and is retried at
  later watch ticks with backoff (``RETRY_ATTEMPTS`` in all), so the pre-mortem lands once space
  returns.
- **CUDA OOM.** The allocator's OOM observer (``backends/cuda.py``) takes
  ``torch.cuda.memory._snapshot()`` (a memory_viz pickle) and the latest findings at each OOM,
  at most ``MAX_OOM_DUMPS`` times per process, before the exception unwinds and frees memory,
  and waits up to ``OOM_WAIT_S`` for them to be on disk (the script's ``except`` may ship them).
  With ``record_history`` the snapshot carries the stack trace of every live block.

The training thread only builds the bytes: ``writer.DumpWriter`` writes, fsyncs and renames them
on a thread of its own (a 3 s NFS fsync costs a step nothing; at exit, pending files are waited
for), and the temporary files a killed process left are removed at start (``writer.clean_stale``).

The observer and the history are set up at the first step boundary after the process
initialises CUDA: before that the allocator has no devices to attach them to.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import pickle
from typing import Any, Protocol

from memexporter.collectors.scrape import Scrape, Sources
from memexporter.diagnose.engine import WATCH_INTERVAL_S, Diagnosis
from memexporter.diagnose.report import document, on_largest_input, oom_view
from memexporter.diagnose.writer import DumpWriter, clean_stale, write_atomic
from memexporter.oom.advice import MIN_SHARE, REMEDY, applies
from memexporter.oom.view import describe_full
from memexporter.units import fmt_bytes

__all__ = ["AllocatorSource", "CudaHooks", "Premortem", "premortem_reason", "write_atomic"]

log = logging.getLogger("memexporter")

PREMORTEM_ETA_S = 300.0
PREMORTEM_UTILISATION = 0.95
MAX_OOM_DUMPS = 3
RECORD_MAX_ENTRIES = 100_000
OOM_WAIT_S = 10.0
"""At a CUDA OOM, the longest the allocating thread waits for the dump to be on disk."""
RETRY_ATTEMPTS = 10
RETRY_TICKS_MAX = 150
"""Most watch ticks (``WATCH_INTERVAL_S`` or more each) between two attempts: about 5 minutes."""


def why(error: OSError) -> str:
    """``No space left on device (ENOSPC)``: the reason in one line, no traceback."""
    code = errno.errorcode.get(error.errno or 0)
    return f"{error.strerror or error}" + (f" ({code})" if code else "")


def premortem_reason(view: dict[str, dict[str, Any]]) -> str | None:
    """Why a pre-mortem is due now (``oom_view()`` data), or None."""
    for device, v in view.items():
        eta, util = v.get("oom_eta_seconds"), v.get("utilisation")
        if eta is not None and eta < PREMORTEM_ETA_S:
            return f"{device}: OOM ETA {eta:.0f} s (< {PREMORTEM_ETA_S:.0f} s)"
        if util is not None and util > PREMORTEM_UTILISATION:
            return (
                f"{device}: {100 * util:.1f} % of the limit committed ({fmt_bytes(v['committed_bytes'])} of "
                f"{fmt_bytes(v['limit_bytes'])}"
                + (f", {fmt_bytes(v['used_bytes'])} allocated)" if device != "cpu" else ")")
            )
    return None


class Premortem:
    """The watch-tick check that writes the pre-mortem once. ``path`` is set once written;
    ``attempts`` counts the writes tried. Cleans ``directory`` of stale temporary files."""

    what = "the pre-mortem (its census or document)"  # named by the diagnosis if this raises

    def __init__(self, diagnosis: Diagnosis, directory: str, writer: DumpWriter | None = None) -> None:
        self.diagnosis, self.directory = diagnosis, directory
        self.writer = writer if writer is not None else diagnosis.writer
        self.path: str | None = None
        self.done = False  # written, or given up
        self.attempts = 0
        self.reason: str | None = None
        self._data: bytes | None = None  # the document, kept for the next attempt
        self._busy = False  # with the writer thread now
        self._wait = 0  # watch ticks before the next attempt
        clean_stale(directory)

    def __call__(self, step: int, now: float) -> None:
        if self.done or self._busy:
            return
        if self._data is None:
            reason = premortem_reason(oom_view(self.diagnosis.sources))
            if reason is None:
                return
            if (largest := on_largest_input(self.diagnosis.sources)) is not None:
                reason += f"; {largest}"
            self.done = True  # a census or document that fails is not retried at every tick
            latest = self.diagnosis.findings
            if latest is None or latest.census.step != step:
                self.diagnosis.take(step, reason)
            doc = document(self.diagnosis, top=1000)
            doc["reason"] = self.reason = reason
            self._data = json.dumps(doc, allow_nan=False, indent=1).encode()
            self.done = False
        elif self._wait > 0:
            self._wait -= 1
            return
        rank = self.diagnosis.sources.rank
        path = os.path.join(self.directory, f"memexporter-premortem-rank{rank}-pid{os.getpid()}.json")
        self._busy = True
        self.attempts += 1
        try:
            self.writer.submit(path, self._data, self._written)
        except BaseException:  # no thread to write it (out of threads?): the next tick tries again
            self._busy = False
            raise

    def _written(self, path: str, error: OSError | None) -> None:
        """The writer thread's answer: done, or one line and a later attempt."""
        try:
            if error is None:
                self.path, self.done, self._data = path, True, None
                log.warning("memexporter: pre-mortem written to %s (%s)", path, self.reason)
            elif self.attempts >= RETRY_ATTEMPTS:
                self.done, self._data = True, None
                log.error(
                    "memexporter: could not write the pre-mortem to %s: %s; gave up after %d attempts",
                    path,
                    why(error),
                    self.attempts,
                )
            else:
                self._wait = min(RETRY_TICKS_MAX, 2 ** (self.attempts - 1))
                log.error(
                    "memexporter: could not write the pre-mortem to %s: %s; trying again at a step boundary %.0f s "
                    "or more from now (attempt %d of %d; training goes on)",
                    path,
                    why(error),
                    (self._wait + 1) * WATCH_INTERVAL_S,
                    self.attempts,
                    RETRY_ATTEMPTS,
                )
        finally:
            self._busy = False


def what_ran_out(sources: Sources, device: int, asked: int, device_free: int) -> str:
    """``asked 20.0 MiB: the 6.00 GiB limit (memory fraction 0.043) of cuda:0 is full: 4.80 GiB
    allocated, 1.20 GiB stranded in partly used segments (6.00 GiB reserved)``, and the remedy when
    it applies. From a scrape's reading (the OOM observer runs after the allocator let go of its
    lock); the driver's free figure only if that reading fails: under a memory fraction the device
    can have 130 GiB free while the job's limit is full. An OOM in a step given the largest input so far
    says so, with that input's size and the largest before it (``report.on_largest_input``)."""
    label = f"cuda:{device}"
    try:
        scrape = Scrape(sources)
        view = scrape.views[label]
        reserved = scrape.allocator_stats.get(device, {}).get("reserved_bytes.all.current")
        text = f"asked {fmt_bytes(asked)}: {describe_full(view, label, asked, reserved)}"
        if (
            view.limit
            and view.stranded > MIN_SHARE * view.limit
            and applies(label, scrape.allocator_backend, scrape.expandable_segments)
        ):
            text += f"; {REMEDY} would likely recover the stranded {fmt_bytes(view.stranded)}"
        if (largest := on_largest_input(sources)) is not None:
            text += f"; {largest}"
        return text
    except Exception:  # the message must not cost the dump
        return f"asked {fmt_bytes(asked)} on {label}, {fmt_bytes(device_free)} free on the device (the driver's figure)"


class AllocatorSource(Protocol):
    """What this module needs from ``backends.cuda.TorchBackend``."""

    def is_initialized(self) -> bool: ...
    def memory_snapshot(self) -> dict[str, Any] | None: ...
    def record_memory_history(self, max_entries: int) -> None: ...
    def attach_oom_observer(self, observer: Any) -> None: ...


class CudaHooks:
    """Turns on allocation history and the OOM dump once CUDA is initialised (boundary callback)."""

    def __init__(
        self, backend: AllocatorSource, diagnosis: Diagnosis, directory: str | None, record_history: bool
    ) -> None:
        self.backend, self.diagnosis, self.directory = backend, diagnosis, directory
        self.record_history = record_history
        self.ready = not (record_history or directory)
        self.dumps: list[str] = []
        self.listeners: list[Any] = []  # called with (device, asked) at each OOM: the board's last words
        self._pid = os.getpid()

    def on_boundary(self, step: int) -> None:
        if self.ready or not self.backend.is_initialized():
            return
        self.ready = True
        try:
            if self.record_history:
                self.backend.record_memory_history(RECORD_MAX_ENTRIES)
            if self.directory:
                self.backend.attach_oom_observer(self.on_oom)
        except Exception as exc:  # e.g. cudaMallocAsync, which supports neither
            log.warning("memexporter: CUDA allocator history/OOM observer unavailable: %s", exc)

    def on_oom(self, device: int, asked: int, device_limit: int, device_free: int) -> None:
        """The allocator's OOM observer: take the snapshot and the findings now, and hand them to
        the writer. Never raises."""
        if not self.diagnosis.closed and os.getpid() == self._pid:
            for listener in self.listeners:
                try:
                    listener(device, asked)
                except Exception:
                    log.debug("memexporter: an OOM listener failed", exc_info=True)
        if self.diagnosis.closed or os.getpid() != self._pid or len(self.dumps) >= MAX_OOM_DUMPS or not self.directory:
            return
        try:
            stem = os.path.join(
                self.directory,
                f"memexporter-oom-rank{self.diagnosis.sources.rank}-pid{os.getpid()}-{len(self.dumps) + 1}",
            )
            snapshot = self.backend.memory_snapshot()
            doc = document(self.diagnosis, top=1000)
            doc["reason"] = what = f"CUDA OOM: {what_ran_out(self.diagnosis.sources, device, asked, device_free)}"
            files = [(stem + ".json", json.dumps(doc, allow_nan=False, indent=1).encode())]
            if snapshot is not None:
                files.insert(0, (stem + ".pickle", pickle.dumps(snapshot, protocol=4)))
            self.dumps.append(stem)
            for path, data in files:
                self.diagnosis.writer.submit(path, data, functools.partial(self._written, what))
            # Unlike the pre-mortem (written while training is healthy), the OOM dump is waited
            # for, within a bound: the script's `except OutOfMemoryError:` may read or ship it.
            self.diagnosis.writer.flush(OOM_WAIT_S)
        except Exception:
            log.exception("memexporter: could not take the OOM dump (allocator snapshot or census document)")

    @staticmethod
    def _written(what: str, path: str, error: OSError | None) -> None:
        if error is not None:
            log.error("memexporter: %s: could not write %s: %s", what, path, why(error))
        elif path.endswith(".pickle"):
            log.error(
                "memexporter: %s: allocator snapshot written to %s (open it at https://pytorch.org/memory_viz)",
                what,
                path,
            )
        else:
            log.error("memexporter: %s: census and findings written to %s", what, path)
