"""Plugs the diagnosis into an exporter: the step tracker's boundary callbacks, the routes, the
dump directory. ``attach()`` is called by ``exporter.start()``; ``Diagnostics.close()`` by ``stop()``."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from memexporter.config import Config
from memexporter.diagnose.dumps import AllocatorSource, CudaHooks, Premortem
from memexporter.diagnose.engine import Diagnosis
from memexporter.diagnose.http import routes
from memexporter.scrape import Sources
from memexporter.server import Route

__all__ = ["Diagnosis", "Diagnostics", "attach"]

log = logging.getLogger("memexporter")


@dataclass
class Diagnostics:
    """The diagnosis of one exporter: its findings, its HTTP routes (when debug is on), its hooks."""

    diagnosis: Diagnosis
    routes: dict[str, Route]
    cuda: CudaHooks
    premortem: Premortem | None

    def close(self) -> None:
        """Stop the censuses and unhook from the step tracker (the OOM observer goes quiet)."""
        self.diagnosis.close()
        if self.diagnosis.sources.steps is not None:
            self.diagnosis.sources.steps.remove_boundary_callback(self.diagnosis.on_boundary)
            self.diagnosis.sources.steps.remove_boundary_callback(self.cuda.on_boundary)


def attach(config: Config, sources: Sources, allocator: AllocatorSource) -> Diagnostics | None:
    """Set up the diagnosis when ``debug``, ``oom_dump_dir`` or ``record_history`` asks for it."""
    if not (config.debug or config.oom_dump_dir or config.record_history):
        return None
    diagnosis = Diagnosis(sources, config.census_every, config.census_budget)
    cuda = CudaHooks(allocator, diagnosis, config.oom_dump_dir, config.record_history)
    premortem = None
    if config.oom_dump_dir:
        try:
            os.makedirs(config.oom_dump_dir, exist_ok=True)
        except OSError as exc:
            log.error("memexporter: cannot create oom_dump_dir %r (%s): no pre-mortem will be written", config.oom_dump_dir, exc)
        premortem = Premortem(diagnosis, config.oom_dump_dir)
        diagnosis.watchers.append(premortem)
    if sources.steps is not None:
        sources.steps.add_boundary_callback(cuda.on_boundary)
        if config.debug or config.oom_dump_dir:  # record_history alone needs no census
            sources.steps.add_boundary_callback(diagnosis.on_boundary)
    cuda.on_boundary(0)  # CUDA may be up already (the model was moved before start())
    if config.debug and not config.http:
        log.warning("memexporter: debug=True with http=False: no port is open, so there are no /debug endpoints; "
                    "the census, the leak log line and oom_dump_dir still work")
    served = routes(diagnosis, allocator.memory_snapshot, config.debug_allow) if config.debug else {}
    return Diagnostics(diagnosis, served, cuda, premortem)
