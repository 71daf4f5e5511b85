"""The panel tables of the three dashboards: what each panel asks and which queries answer it.

Every query filters ``job``, ``instance`` and ``rank`` through the dashboard variables (``m()``).
``grafana.py`` turns the tables into Grafana's JSON.
"""

from __future__ import annotations

from memexporter.dashboards.annotations import alerts_annotation, fatal_oom_annotation, phases_annotation
from memexporter.dashboards.grafana import JSON, Panel, dashboard
from memexporter.rules.params import PEER_LABELS

SEL = 'job=~"$job", instance=~"$instance", rank=~"$rank"'
_FAMILIES = ("parameter", "gradient", "optimizer_state", "activation")


def m(name: str) -> str:
    """``memexporter_<name>{job=~"$job", instance=~"$instance", rank=~"$rank"}``."""
    return f"memexporter_{name}{{{SEL}}}"


def by_kind(expr: str) -> str:
    """Add a ``device_kind`` label (``cuda`` or ``cpu``): ranks compare like with like, and
    rank 0 on ``cuda:0`` must be compared with rank 1 on ``cuda:1``."""
    return f'label_replace({expr}, "device_kind", "$1", "device", "([a-z]+).*")'


def _overview() -> list[Panel]:
    ri = "[$__rate_interval]"
    alloc = "allocator_"
    return [
        Panel("Memory used, limit and step peak", "timeseries", "bytes",
              "How close is each rank to its OOM limit? used is live memory (cuda: allocated bytes, cpu: RSS), "
              "limit is what used can reach before an OOM, peak the highest used in the last step, baseline "
              "what persists between steps.",
              ((m("memory_used_bytes"), "used r{{rank}} {{device}}"),
               (m("memory_limit_bytes"), "limit r{{rank}} {{device}}"),
               (m("memory_peak_bytes"), "step peak r{{rank}} {{device}}"),
               (m("memory_baseline_bytes"), "baseline r{{rank}} {{device}}")), w=16, h=9),
        Panel("Time to OOM", "stat", "s",
              "How long until the step peak reaches the limit at the current leak rate? Infinity means memory "
              "is not growing beyond its own noise.",
              ((f"min by (rank, device) ({m('oom_eta_seconds')})", "r{{rank}} {{device}}"),),
              w=8, h=9, instant=True, thresholds=(("red", None), ("orange", 3600.0), ("green", 86400.0))),
        Panel("Headroom at step peak", "bargauge", "percentunit",
              "What fraction of the limit is still free at the step peak? 1 - peak / limit, per rank and device.",
              ((f"1 - {m('memory_peak_bytes')} / {m('memory_limit_bytes')}", "r{{rank}} {{device}}"),),
              w=8, instant=True, thresholds=(("red", None), ("orange", 0.1), ("green", 0.25))),
        Panel("Leak rate", "timeseries", "binBps",
              "Is the memory that persists between steps growing? Robust slope of the baseline over the leak "
              "window; 0 until enough steps and while within noise.",
              ((m("leak_rate_bytes_per_second"), "r{{rank}} {{device}}"),), w=8),
        Panel("Leak per step", "timeseries", "bytes",
              "How many bytes does the baseline grow per training step? The same slope against the step count.",
              ((m("leak_bytes_per_step"), "r{{rank}} {{device}}"),), w=8),
        Panel("Allocator reserved vs allocated", "timeseries", "bytes",
              "How much memory does the CUDA caching allocator hold beyond live tensors? reserved - allocated is "
              "cache; active includes blocks waiting on streams.",
              ((m(alloc + "reserved_bytes"), "reserved r{{rank}} {{device}}"),
               (m(alloc + "allocated_bytes"), "allocated r{{rank}} {{device}}"),
               (m(alloc + "active_bytes"), "active r{{rank}} {{device}}")), w=12),
        Panel("Allocator fragmentation", "timeseries", "percentunit",
              "How much of the reserved memory is stranded in inactive split blocks? inactive_split / reserved; "
              "high values mean large allocations may fail although memory is free.",
              ((m(alloc + "fragmentation_ratio"), "r{{rank}} {{device}}"),), w=12,
              thresholds=(("green", None), ("orange", 0.3), ("red", 0.5))),
        Panel("Allocator retries and OOMs", "timeseries", "short",
              "Is the allocator thrashing? Retries are cudaMalloc calls retried after flushing the cache (the "
              "classic pre-OOM signal); OOMs are errors raised. Counted per rate interval.",
              ((f"increase({m(alloc + 'alloc_retries_total')}{ri})", "retries r{{rank}} {{device}}"),
               (f"increase({m(alloc + 'ooms_total')}{ri})", "OOMs r{{rank}} {{device}}")), w=12),
        Panel("Host RSS and DataLoader workers", "timeseries", "bytes",
              "How much host memory do the training process and its children (DataLoader workers) hold, "
              "against the host or cgroup limit?",
              ((m("host_rss_bytes"), "rss r{{rank}}"), (m("host_children_rss_bytes"), "children r{{rank}}"),
               (m("host_limit_bytes"), "limit r{{rank}}")), w=12),
        Panel("Training steps per second", "timeseries", "ops",
              "Is the job making progress? Rate of steps seen (optimizer steps or memexporter.step()).",
              ((f"rate({m('steps_total')}{ri})", "r{{rank}}"),), w=8),
        Panel("GPU memory, all processes (NVML)", "timeseries", "bytes",
              "Does anything else use this GPU? Device memory used by every process, as NVML reports it, "
              "against the device total.",
              ((m("device_used_bytes"), "used r{{rank}} {{device}}"),
               (m("device_total_bytes"), "total r{{rank}} {{device}}")), w=8),
        Panel("Collector success", "timeseries", "bool_yes_no",
              "Is every collector working? 0 means the collector raised and its series were dropped.",
              ((f"min by (collector) ({m('collector_success')})", "{{collector}}"),), w=8),
        Panel("Peak per phase", "timeseries", "bytes",
              "Which phase of the run needs the most memory? The peak of the last completed occurrence of each "
              "phase (forward, backward and optimizer of a tracked model, and memexporter.phase() names such as "
              "eval or checkpoint), per rank and device, against the limit. Out-of-step phases (eval, validation, "
              "test, predict, checkpoint) are kept out of the step peak.",
              ((f"max by (rank, device, phase) ({m('phase_peak_bytes')})", "{{phase}} r{{rank}} {{device}}"),
               (m("memory_limit_bytes"), "limit r{{rank}} {{device}}")), w=16),
        Panel("Time since last step", "stat", "s",
              "Is the run still making progress? Seconds since the last step boundary, beside the run's own "
              "median step (the last 32 steps). MemexporterTrainingStalled pages when it stays above 10 times "
              "the median step (at least 15 minutes), or 10 times the last duration of an evaluation open on a rank "
              "of the run.",
              ((f"time() - {m('last_step_timestamp_seconds')}", "since last step r{{rank}}"),
               (m("step_interval_seconds"), "median step r{{rank}}")), w=8, instant=True),
    ]


def _modules() -> list[Panel]:
    panels = [
        Panel(f"Top modules by {fam.replace('_', ' ')} bytes", "timeseries", "bytes",
              f"Which modules hold the most {fam.replace('_', ' ')} memory? The $topk largest modules (the "
              "highest value across the selected ranks), stacked; rows partition the model, so the stack is the "
              "model's total when all modules fit.",
              ((f"topk($topk, max by (module) ({m(f'module_{fam}_bytes')}))", "{{module}}"),), stack=True)
        for fam in _FAMILIES
    ]
    panels.append(Panel(
        "Model memory by family", "timeseries", "bytes",
        "How is the model's memory split between parameters, gradients, optimizer state and saved activations? "
        "Sum over modules, per rank.",
        tuple((f"sum by (rank) ({m(f'module_{fam}_bytes')})", f"{fam.replace('_', ' ')} r{{{{rank}}}}")
              for fam in _FAMILIES), w=24, stack=True))
    panels.append(Panel(
        "Module breakdown", "table", "bytes",
        "Current bytes per module and family (the highest value across the selected ranks). Sort by a column "
        "to find the module to shrink, checkpoint or shard.",
        tuple((f"max by (module) ({m(f'module_{fam}_bytes')})", fam.replace("_", " ")) for fam in _FAMILIES),
        w=24, h=12, instant=True))
    # Rows with no parameters of their own (a container, the root) have nothing to share: left out.
    unsharded, held = f'({m("module_parameter_unsharded_bytes")} > 0)', m("module_parameter_bytes")
    panels.append(Panel(
        "Sharded modules: share held per rank", "table", "percentunit",
        "Under FSDP2 or tensor parallelism each rank holds a shard of a module's parameters: is blocks.3 small, "
        "or does this rank hold 1/8 of it? The largest and smallest share of each module held by one rank "
        "(1 / world size when evenly sharded; 1 for a module left whole).",
        ((f"max by (module) ({held} / {unsharded})", "largest share"),
         (f"min by (module) ({held} / {unsharded})", "smallest share")),
        w=12, h=10, instant=True))
    panels.append(Panel(
        "Sharded modules: unsharded size", "table", "bytes",
        "How large is each module's parameter set unsharded: what FSDP2 all-gathers for its forward and backward?",
        ((f"max by (module) ({unsharded})", "unsharded"),), w=12, h=10, instant=True))
    return panels


def _ranks() -> list[Panel]:
    peak, limit = m("memory_peak_bytes"), m("memory_limit_bytes")
    # Peers are the ranks of one training run on one kind of device, as in the alert rules.
    peers = ", ".join((*PEER_LABELS, "device_kind"))
    spread = f"max by ({peers}) ({by_kind(peak)}) - min by ({peers}) ({by_kind(peak)})"
    # What MemexporterRankImbalance measures (on the step peak, without its median smoothing).
    excess = (f"({by_kind(peak)} - on ({peers}) group_left () "
              f"quantile by ({peers}) (0.5, {by_kind(peak)})) / ignoring (device_kind) {limit}")
    return [
        Panel("Step peak per rank", "bargauge", "bytes",
              "Do the ranks peak at the same level? The last step's peak per rank, side by side.",
              ((f"max by (rank, device) ({peak})", "r{{rank}} {{device}}"),), instant=True),
        Panel("Excess over the median rank", "bargauge", "percentunit",
              "How far above the median rank of its training run (same job, namespace and run_id) does each "
              "rank peak, as a share of its own limit? This is what the MemexporterRankImbalance alert watches "
              "(it smooths with a median over time).",
              ((excess, "r{{rank}} {{device}}"),), instant=True,
              thresholds=(("green", None), ("orange", 0.1), ("red", 0.25))),
        Panel("Rank closest to its limit", "stat", "percentunit",
              "Which rank runs out of memory first? The largest step peak / limit across ranks and devices.",
              ((f"topk(1, {peak} / {limit})", "rank {{rank}} {{device}}"),), w=8, instant=True,
              thresholds=(("green", None), ("orange", 0.8), ("red", 0.9))),
        Panel("Peak / limit per rank", "bargauge", "percentunit",
              "How full is each rank at its step peak? step peak / limit per rank and device.",
              ((f"{peak} / {limit}", "r{{rank}} {{device}}"),), w=16, instant=True,
              thresholds=(("green", None), ("orange", 0.8), ("red", 0.9))),
        Panel("Step peak per rank over time", "timeseries", "bytes",
              "When did the ranks diverge? The step peak of each rank over time.",
              ((peak, "r{{rank}} {{device}}"),)),
        Panel("Peak spread across ranks (max - min)", "timeseries", "bytes",
              "How far apart are the highest and lowest rank's step peaks, per training run (job, namespace, "
              "run_id) and device kind (cpu, cuda)?",
              ((spread, "{{job}} {{namespace}} {{run_id}} {{device_kind}}"),)),
        Panel("Steps per second per rank", "timeseries", "ops",
              "Is a rank lagging behind? Step rate per rank; in data-parallel jobs they should match.",
              ((f"rate({m('steps_total')}[$__rate_interval])", "r{{rank}}"),), w=24),
    ]


def build() -> dict[str, JSON]:
    """``{filename: dashboard JSON}`` for every dashboard."""
    topk = {"name": "topk", "label": "Top K", "type": "custom", "query": "5,10,20", "hide": 0, "multi": False,
            "includeAll": False, "current": {"selected": True, "text": "10", "value": "10"},
            "options": [{"selected": v == "10", "text": v, "value": v} for v in ("5", "10", "20")]}
    return {
        "memexporter-overview.json": dashboard("memexporter-overview", "Overview", _overview(),
                                               annotations=[alerts_annotation(), fatal_oom_annotation(),
                                                            phases_annotation(SEL)]),
        "memexporter-modules.json": dashboard("memexporter-modules", "Modules", _modules(), [topk]),
        "memexporter-ranks.json": dashboard("memexporter-ranks", "Ranks", _ranks()),
    }
