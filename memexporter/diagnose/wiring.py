"""Plugs the diagnosis into an exporter: the step tracker's boundary callbacks, the routes, the
dump directory, the debug token. ``attach()`` is called by ``exporter.start()``;
``Diagnostics.close()`` by ``stop()``.

The token file is named by the port (``token.py``). ``attach()`` runs before the helper binds, so
it writes the file for the port the exporter is about to bind (``port + LOCAL_RANK``);
``Diagnostics.served(port)``, called once the helper reports the bind, corrects it (port 0) or removes it
(the bind failed). ``Diagnostics.debug()`` is what the helper needs to guard the routes (the allow-list,
the token's value, where the token file is) and the apps the job answers with.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from memexporter.collectors.scrape import Sources
from memexporter.config import Config
from memexporter.diagnose.dumps import AllocatorSource, CudaHooks, Premortem
from memexporter.diagnose.endpoints import public_networks, routes, token_hint
from memexporter.diagnose.engine import Diagnosis
from memexporter.diagnose.token import DebugToken
from memexporter.serving.handler import WSGIApp
from memexporter.serving.job.debug import Debug

__all__ = ["Diagnosis", "Diagnostics", "attach"]

log = logging.getLogger("memexporter")


@dataclass
class Diagnostics:
    """The diagnosis of one exporter: its findings, its HTTP routes (when debug is on), its hooks."""

    diagnosis: Diagnosis
    apps: dict[str, tuple[WSGIApp, str]]  # path: (the app the job answers with, its landing-page line)
    cuda: CudaHooks
    premortem: Premortem | None
    token: DebugToken | None = None
    allow: tuple[str, ...] = ()

    def debug(self) -> Debug | None:
        """The debug routes for the helper (None when debug is off)."""
        if not self.apps:
            return None
        token = self.token
        hint = token_hint(token) if token is not None else ""
        return Debug(self.apps, self.allow, token.value if token is not None else None, hint)

    def served(self, port: int | None) -> None:
        """The server is bound to ``port`` (None: it could not bind): the token file follows."""
        if self.token is None:
            return
        if port is None:
            self.token.withdraw()
        elif self.token.path is None or not self.token.path.name.endswith(f"-{port}.token"):
            self.token.publish(port)

    def close(self) -> None:
        """Stop the censuses and unhook from the step tracker (the OOM observer goes quiet); remove
        the token file."""
        if self.token is not None:
            self.token.withdraw()
        self.diagnosis.close()
        if self.diagnosis.sources.steps is not None:
            self.diagnosis.sources.steps.remove_boundary_callback(self.diagnosis.on_boundary)
            self.diagnosis.sources.steps.remove_boundary_callback(self.cuda.on_boundary)


def attach(config: Config, sources: Sources, allocator: AllocatorSource) -> Diagnostics | None:
    """Set up the diagnosis when ``debug``, ``oom_dump_dir`` or ``record_history`` asks for it."""
    if not (config.debug or config.oom_dump_dir or config.record_history):
        return None
    token = DebugToken.create() if config.debug and config.http else None  # a short MEMEXPORTER_DEBUG_TOKEN raises here
    diagnosis = Diagnosis(sources, config.census_every, config.census_budget)
    cuda = CudaHooks(allocator, diagnosis, config.oom_dump_dir, config.record_history)
    premortem = None
    if config.oom_dump_dir:
        try:
            os.makedirs(config.oom_dump_dir, exist_ok=True)
        except OSError as exc:
            log.error(
                "memexporter: cannot create oom_dump_dir %r (%s): no pre-mortem will be written",
                config.oom_dump_dir,
                exc,
            )
        premortem = Premortem(diagnosis, config.oom_dump_dir)
        diagnosis.watchers.append(premortem)
    if sources.steps is not None:
        sources.steps.add_boundary_callback(cuda.on_boundary)
        if config.debug or config.oom_dump_dir:  # record_history alone needs no census
            sources.steps.add_boundary_callback(diagnosis.on_boundary)
    cuda.on_boundary(0)  # CUDA may be up already (the model was moved before start())
    if config.debug and not config.http:
        log.warning(
            "memexporter: debug=True with http=False: no port is open, so there are no /debug endpoints; "
            "the census, the leak log line and oom_dump_dir still work"
        )
    apps = routes(diagnosis, allocator.memory_snapshot) if config.debug else {}
    diagnostics = Diagnostics(diagnosis, apps, cuda, premortem, token, config.debug_allow)
    if token is not None:
        _warn_open(config.debug_allow)
        if config.port and sources.identity.local_rank.isdigit():  # the exporter has checked it
            diagnostics.served(config.port + int(sources.identity.local_rank))
    return diagnostics


def _warn_open(allow: tuple[str, ...]) -> None:
    """A loud warning for an allow-list that reaches past private address space (the token still
    guards the endpoints, but it travels in clear over plain HTTP)."""
    wide = public_networks(allow)
    if wide:
        log.warning(
            "memexporter: WARNING: debug_allow=%s opens /debug/* (tensor census, holder names, the "
            "allocator snapshot) to addresses outside private networks; only the debug token stands in "
            "the way, and it crosses the network in clear unless certfile/keyfile set up TLS. Name the "
            "networks you read from instead (e.g. 10.0.0.0/8)",
            ",".join(wide),
        )
