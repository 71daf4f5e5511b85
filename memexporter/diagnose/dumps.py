"""Files in ``oom_dump_dir``: the pre-mortem (any device) and the CUDA OOM snapshot.

- **Pre-mortem.** On the diagnosis' watch tick (training thread), when a device's OOM ETA drops
  under ``PREMORTEM_ETA_S`` or its use passes ``PREMORTEM_UTILISATION`` of its limit, a fresh
  census is taken and the whole ``/debug/memory`` document is written, once per process. It is
  written before the OOM, so it survives the OOM killer's SIGKILL; each file is written to a
  temporary name, fsynced and renamed, so a kill mid-write leaves no half file.
- **CUDA OOM.** The allocator's OOM observer (``backends/torch.py``) writes
  ``torch.cuda.memory._snapshot()`` (a memory_viz pickle) and the latest findings at each OOM,
  at most ``MAX_OOM_DUMPS`` times per process, before the exception unwinds and frees memory.
  With ``record_history`` the snapshot carries the stack trace of every live block.

The observer and the history are set up at the first step boundary after the process
initialises CUDA: before that the allocator has no devices to attach them to.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import tempfile
from typing import Any, Protocol

from memexporter.diagnose.engine import Diagnosis
from memexporter.diagnose.report import document, oom_view
from memexporter.diagnose.words import fmt_bytes

log = logging.getLogger("memexporter")

PREMORTEM_ETA_S = 300.0
PREMORTEM_UTILISATION = 0.95
MAX_OOM_DUMPS = 3
RECORD_MAX_ENTRIES = 100_000


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader (or a crash) sees all of it or nothing."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".memexporter-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must reach the disk
    finally:
        os.close(dir_fd)


def premortem_reason(view: dict[str, dict[str, Any]]) -> str | None:
    """Why a pre-mortem is due now (``oom_view()`` data), or None."""
    for device, v in view.items():
        eta, util = v.get("oom_eta_seconds"), v.get("utilisation")
        if eta is not None and eta < PREMORTEM_ETA_S:
            return f"{device}: OOM ETA {eta:.0f} s (< {PREMORTEM_ETA_S:.0f} s)"
        if util is not None and util > PREMORTEM_UTILISATION:
            return (f"{device}: {100 * util:.1f} % of the limit in use ({fmt_bytes(v['used_bytes'])} of "
                    f"{fmt_bytes(v['limit_bytes'])})")
    return None


class Premortem:
    """The watch-tick check that writes the pre-mortem once. ``path`` is set once written."""

    def __init__(self, diagnosis: Diagnosis, directory: str) -> None:
        self.diagnosis, self.directory = diagnosis, directory
        self.path: str | None = None
        self.done = False

    def __call__(self, step: int, now: float) -> None:
        if self.done:
            return
        reason = premortem_reason(oom_view(self.diagnosis.sources))
        if reason is None:
            return
        self.done = True  # once, even if writing fails (a full disk must not cost a census per tick)
        latest = self.diagnosis.findings
        if latest is None or latest.census.step != step:
            self.diagnosis.take(step, reason)
        doc = document(self.diagnosis, top=1000)
        doc["reason"] = reason
        rank = self.diagnosis.sources.rank
        path = os.path.join(self.directory, f"memexporter-premortem-rank{rank}-pid{os.getpid()}.json")
        write_atomic(path, json.dumps(doc, allow_nan=False, indent=1).encode())
        self.path = path
        log.warning("memexporter: pre-mortem written to %s (%s)", path, reason)


class AllocatorSource(Protocol):
    """What this module needs from ``backends.torch.TorchBackend``."""

    def is_initialized(self) -> bool: ...
    def memory_snapshot(self) -> dict[str, Any] | None: ...
    def record_memory_history(self, max_entries: int) -> None: ...
    def attach_oom_observer(self, observer: Any) -> None: ...


class CudaHooks:
    """Turns on allocation history and the OOM dump once CUDA is initialised (boundary callback)."""

    def __init__(self, backend: AllocatorSource, diagnosis: Diagnosis, directory: str | None, record_history: bool) -> None:
        self.backend, self.diagnosis, self.directory = backend, diagnosis, directory
        self.record_history = record_history
        self.ready = not (record_history or directory)
        self.dumps: list[str] = []
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
        """The allocator's OOM observer: write the snapshot and the findings. Never raises."""
        if self.diagnosis.closed or os.getpid() != self._pid or len(self.dumps) >= MAX_OOM_DUMPS or not self.directory:
            return
        try:
            stem = os.path.join(self.directory, f"memexporter-oom-rank{self.diagnosis.sources.rank}"
                                f"-pid{os.getpid()}-{len(self.dumps) + 1}")
            snapshot = self.backend.memory_snapshot()
            if snapshot is not None:
                write_atomic(stem + ".pickle", pickle.dumps(snapshot, protocol=4))
            doc = document(self.diagnosis, top=1000)
            doc["reason"] = f"cuda:{device}: out of memory asking for {asked} bytes ({device_free} free of {device_limit})"
            write_atomic(stem + ".json", json.dumps(doc, allow_nan=False, indent=1).encode())
            self.dumps.append(stem)
            log.error("memexporter: CUDA OOM on cuda:%d (asked %s, %s free): allocator snapshot and census written to "
                      "%s.{pickle,json}; open the pickle at https://pytorch.org/memory_viz",
                      device, fmt_bytes(asked), fmt_bytes(device_free), stem)
        except Exception:
            log.exception("memexporter: could not write the OOM dump")
