"""The exporter's own identity: build, process and run info, hook errors, dropped HTTP connections, the
HTTP helper's restarts."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.collectors.scrape import Scrape
from memexporter.metrics import families


def hook_errors(scrape: Scrape) -> int:
    """Errors caught in the step hooks and the module hooks, summed."""
    from memexporter.tracking.modules import hook_errors as module_hook_errors

    tracker = scrape.sources.steps
    return (tracker.errors if tracker is not None else 0) + module_hook_errors()


class ExporterCollector:
    """The exporter's own series, from ``Sources``: build, process and run info, hook errors, and the HTTP
    server's dropped connections and its helper's restarts (none without HTTP)."""

    name = "exporter"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        src = scrape.sources
        ident = src.identity
        torch_version, cuda_version = src.allocator.versions()
        dropped = src.http.dropped() if src.http is not None else {}
        return families(
            {
                "memexporter_build_info": [((ident.rank, src.version, torch_version, cuda_version), 1.0)],
                "memexporter_process_info": [((ident.rank, ident.local_rank, ident.world_size, ident.hostname), 1.0)],
                "memexporter_run_info": [((ident.rank, ident.run_id, ident.run_id_source, ident.detail), 1.0)],
                "memexporter_hook_errors_total": [((ident.rank,), float(hook_errors(scrape)))],
                "memexporter_http_dropped_connections_total": [((ident.rank, r), float(n)) for r, n in dropped.items()],
                "memexporter_helper_restarts_total": [((ident.rank,), float(src.http.restarts()))]
                if src.http is not None
                else [],
            }
        )
