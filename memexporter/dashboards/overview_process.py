"""The Overview's ranks row, second part: what surrounds each rank's device memory. The training
process on its host (RSS, DataLoader workers), its progress (steps a second, time since the last
step), the GPU's other processes (NVML), the collectors, and the peak of each phase.

Bounded like the first part (``overview_memory.py``: the device memory, the leak, the allocator):
the Top K ranks among those selected, or an aggregate.
"""

from __future__ import annotations

from memexporter.dashboards.grafana import Panel
from memexporter.dashboards.overview_memory import END, RI
from memexporter.dashboards.scope import INFO, KEY, RUN, among, by_kind, m, picked, scoped, top

_PHASE, _LIMIT = "phase_peak_bytes", "memory_limit_bytes"


def process_panels() -> tuple[Panel, ...]:
    """The ranks' host memory, progress, other GPU processes, collectors and phases, bounded."""
    rss, nvml = (picked(m(name)) for name in ("host_rss_bytes", "device_used_bytes"))
    stale = f"topk($topk, time() - {scoped(m('last_step_timestamp_seconds'))})"
    steps = f"rate({m('steps_total')}{RI})"
    return (
        Panel(
            "Host RSS and DataLoader workers",
            "timeseries",
            "bytes",
            "How much host memory do the training process and its children (DataLoader workers) hold, "
            "against the host or cgroup limit? The Top K selected ranks by RSS at the end of the time range.",
            (
                (among(m("host_rss_bytes"), rss, KEY), "rss r{{rank}}"),
                (among(m("host_children_rss_bytes"), rss, KEY), "children r{{rank}}"),
                (among(m("host_limit_bytes"), rss, KEY), "limit r{{rank}}"),
            ),
            w=12,
        ),
        Panel(
            "Training steps per second",
            "timeseries",
            "ops",
            "Is the job making progress? Rate of steps seen (optimizer steps or memexporter.step()): the Top K "
            "slowest of the selected ranks (in data parallel they all match)" + END,
            ((top(steps, "bottomk", KEY), "r{{rank}}"),),
            w=8,
        ),
        Panel(
            "GPU memory, all processes (NVML)",
            "timeseries",
            "bytes",
            "Does anything else use this GPU? Device memory used by every process, as nvidia-smi shows it "
            "(NVML v2: without the driver's own reservation), against the device total: the Top K selected "
            "ranks by use at the end of the time range.",
            (
                (among(m("device_used_bytes"), nvml), "used r{{rank}} {{device}}"),
                (among(m("device_total_bytes"), nvml), "total r{{rank}} {{device}}"),
            ),
            w=8,
        ),
        # Failures only (success < 1) are joined to run_info: joining every rank's every collector at
        # each step (10,000 series at 1,024 ranks) took 6 s a refresh. The zeros beside them are a
        # count per collector name, with no join, kept while the selected run has ranks (the ranks'
        # regex is written once per query): a healthy job reads 0, not "No data", which looks like a
        # panel that reads nothing.
        Panel(
            "Collector failures",
            "timeseries",
            "short",
            "Is every collector working? How many of the selected ranks had a collector raise at the last "
            "collection, per collector (its series were dropped from that scrape; the exporter's log has the "
            "error). 0 while every collector works on every rank.",
            (
                (
                    f"count by (collector) ({scoped(m('collector_success') + ' < 1')})"
                    f" or on (collector) (0 * count by (collector) ({m('collector_success')}) and on () count({INFO}{{{RUN}}}))",
                    "{{collector}}",
                ),
            ),
            w=8,
        ),
        Panel(
            "Peak per phase",
            "timeseries",
            "bytes",
            "Which phase of the run needs the most memory? The peak of the last completed occurrence of each "
            "phase (forward, backward and optimizer of a tracked model, and memexporter.phase() names such as "
            "eval or checkpoint), the highest across the selected ranks per device kind, against the lowest "
            "limit. Out-of-step phases (eval, validation, test, predict, checkpoint) are kept out of the step "
            "peak. From 64 ranks up forward, backward and optimizer come from the detail ranks only.",
            # Per device first, then per kind: label_replace runs on a few series, not on every rank's.
            (
                (
                    f"max by (job, phase, device_kind) ({by_kind(f'max by (job, phase, device) ({scoped(m(_PHASE))})')})",
                    "{{phase}} {{device_kind}}",
                ),
                (
                    f"min by (job, device_kind) ({by_kind(f'min by (job, device) ({scoped(m(_LIMIT))})')})",
                    "limit {{device_kind}}",
                ),
            ),
            w=16,
        ),
        Panel(
            "Time since last step",
            "stat",
            "s",
            "Is the run still making progress? Seconds since the last step boundary, beside the rank's own "
            "median step (the last 32 steps), for the Top K selected ranks that stepped longest ago. "
            "MemexporterTrainingStalled pages when it stays above 10 times the median step (at least 15 "
            "minutes), or 10 times the last duration of an evaluation open on a rank of the run.",
            (
                (stale, "since last step r{{rank}}"),
                (among(m("step_interval_seconds"), stale, KEY), "median step r{{rank}}"),
            ),
            w=8,
            instant=True,
        ),
    )
