"""The exporter's own rows: its identity and errors (collectors/exporter.py), the HTTP connections it
dropped (``REASONS``, the ``reason`` label's values), the job's end that the helper process serves
(serving/ending.py) and the collectors' guard (collectors/registry.py); the last rows of ``SPECS``.
"""

from __future__ import annotations

from memexporter.metrics.spec import RANK, MetricSpec, _c, _g

# Why a connection ended without a full answer: the `reason` label values of
# memexporter_http_dropped_connections_total (each exported from 0) and their meaning (its HELP).
REASONS: dict[str, str] = {
    "timeout": "the per-connection deadline passed",
    "reset": "the client closed or reset it first",
    "tls": "the TLS handshake failed",
    "evicted": "a slow client dropped at the connection cap to make room for a waiting one",
    "fd_limit": "refused near the process's descriptor limit",
    "write": "the client closed or reset it while its answer was being written",
    "error": "anything else, logged at debug level",
}


EXPORTER_SPECS: tuple[MetricSpec, ...] = (
    # --- The exporter itself (collectors/exporter.py and the guard in registry.py).
    _g(
        "build_info",
        unit="",
        help="Build information (value 1): memexporter, torch and CUDA versions.",
        labels=("rank", "version", "torch_version", "cuda_version"),
        collector="exporter",
        otel="memexporter.build.info",
    ),
    _g(
        "process_info",
        unit="",
        help="Process identity (value 1): local rank, world size and hostname.",
        labels=("rank", "local_rank", "world_size", "hostname"),
        collector="exporter",
        otel="memexporter.process.info",
    ),
    _g(
        "run_info",
        unit="",
        help="The training run (value 1): run_id from the launcher, run_id_source naming where it came from (memexporter: run_id= or MEMEXPORTER_RUN_ID; torchelastic: TORCHELASTIC_RUN_ID; slurm: SLURM_JOB_ID; master: MASTER_ADDR:MASTER_PORT; process: hostname-pid), and detail: what this rank exports (per_rank: its own full set; representative: the full set for its peers, at 64 ranks and more; core: the core set only).",
        labels=("rank", "run_id", "run_id_source", "detail"),
        collector="exporter",
        otel="memexporter.run.info",
    ),
    _c(
        "hook_errors",
        help="Errors caught in memexporter's training-thread hooks (never raised into training).",
        labels=RANK,
        collector="exporter",
        otel="memexporter.hook.errors",
        counts="{error}",
    ),
    _c(
        "http_dropped_connections",
        help="HTTP connections closed without a full answer, by reason: "
        + "; ".join(f"{k} ({v})" for k, v in REASONS.items())
        + ".",
        labels=("rank", "reason"),
        collector="exporter",
        otel="memexporter.http.dropped_connections",
        counts="{connection}",
        detail=True,
    ),
    _c(
        "helper_restarts",
        help="Times the job started its HTTP helper process again after it exited or stopped answering the job's heartbeat (serving/job/supervise.py); absent without HTTP.",
        labels=RANK,
        collector="exporter",
        otel="memexporter.helper.restarts",
        counts="{restart}",
    ),
)


JOB_END_SPECS: tuple[MetricSpec, ...] = (
    # --- The job's end (serving/ending.py): served by the helper process after the job is gone.
    _g(
        "job_end_info",
        unit="",
        help="Present only after the training process ended, while its helper serves the last snapshot (the grace period): how it ended, as far as the helper could establish (value 1). cause: oom_kill (the memory cgroup's OOM killer killed a process of the job's cgroup while it ran: memory.events oom_kill), cuda_oom (an uncaught CUDA out-of-memory error, or one that no completed step followed), signal, exit, unknown (no exit status and no last words: SIGKILL, os._exit or a crash, reaped before the helper read it); exit_code and signal from /proc/PID/stat while the process was a zombie (absent when not established).",
        labels=("rank", "cause", "exit_code", "signal"),
        collector="ending",
        otel="memexporter.job.end.info",
    ),
    _g(
        "job_end_timestamp_seconds",
        unit="seconds",
        help="When the helper saw the training process end (Unix time); present only in the grace period, as job_end_info.",
        labels=RANK,
        collector="ending",
        otel="memexporter.job.end.timestamp",
    ),
)


# The collectors' guard (collectors/registry.py): how each collector's last run went.
GUARD_SPECS: tuple[MetricSpec, ...] = (
    _g(
        "collector_success",
        unit="",
        help="1 if the collector's last run succeeded, 0 if it raised or could read only part of its series (the part it read is still exported).",
        labels=("rank", "collector"),
        collector="guard",
        otel="memexporter.collector.success",
    ),
    _g(
        "collector_duration_seconds",
        unit="seconds",
        help="Time the collector's last run took.",
        labels=("rank", "collector"),
        collector="guard",
        otel="memexporter.collector.duration",
        detail=True,
    ),
)
