"""The panel tables of the Modules and Ranks dashboards, and ``build()`` for all three.

Every query selects the run and the ranks once, through ``memexporter_run_info`` (``scope.py``), and
returns at most Top K series per rank-level panel, so that a 1,024-rank run costs what an 8-rank one
does. The Overview's tables are in ``overview.py`` (and the three parts it puts together); ``grafana.py``
turns the tables into Grafana's JSON.
"""

from __future__ import annotations

from memexporter.dashboards.annotations import alerts_annotation, fatal_oom_annotation, phases_annotation
from memexporter.dashboards.grafana import Panel, dashboard
from memexporter.dashboards.overview import overview
from memexporter.dashboards.scope import KEY, by_kind, info, m, run_rule, scoped, top, with_run, worst
from memexporter.dashboards.variables import JSON
from memexporter.rules.params import PEER_LABELS

_FAMILIES = ("parameter", "gradient", "optimizer_state", "activation")
# Module rows come from the ranks that export them; the Modules dashboard's rank list holds only those.
_ROWS = (
    " Rows come from the ranks that export them: below 64 ranks every rank, each its own rows "
    "(per_rank); from 64 up the detail ranks (by default the first node's), each standing for its "
    "data-parallel peers, which hold the same table (representative). 'Ranks with module rows' says which."
)


def _rows(family: str) -> str:
    """A module family's rows on the selected ranks that export module rows."""
    return scoped(m(f"module_{family}_bytes"), detail=True)


def _modules() -> list[Panel]:
    panels = [
        Panel(
            "Ranks with module rows",
            "stat",
            "short",
            "Whose module rows do these panels show? The selected ranks that export module rows, counted by "
            "kind: per_rank (each rank its own rows: fewer than 64 ranks, or detail_ranks=all) or "
            "representative (from 64 ranks up, the detail ranks, standing for their peers).",
            ((f"count by (job, run_id, detail) ({info(detail=True)})", "{{detail}} {{run_id}}"),),
            w=24,
            h=4,
            instant=True,
        )
    ]
    panels += [
        Panel(
            f"Top modules by {fam.replace('_', ' ')} bytes",
            "timeseries",
            "bytes",
            f"Which modules hold the most {fam.replace('_', ' ')} memory? The $topk largest modules (the "
            "highest value across the selected ranks), stacked; rows partition the model, so the stack is the "
            "model's total when all modules fit." + _ROWS,
            ((f"topk($topk, max by (module) ({_rows(fam)}))", "{{module}}"),),
            stack=True,
        )
        for fam in _FAMILIES
    ]
    panels.append(
        Panel(
            "Model memory by family",
            "timeseries",
            "bytes",
            "How is the model's memory split between parameters, gradients, optimizer state and saved activations? "
            "Sum over modules per rank: the Top K ranks of each family." + _ROWS,
            tuple(
                (f"topk($topk, sum by (job, instance, rank) ({_rows(fam)}))", f"{fam.replace('_', ' ')} r{{{{rank}}}}")
                for fam in _FAMILIES
            ),
            w=24,
            stack=True,
        )
    )
    panels.append(
        Panel(
            "Module breakdown",
            "table",
            "bytes",
            "Current bytes per module and family (the highest value across the selected ranks). Sort by a column "
            "to find the module to shrink, checkpoint or shard." + _ROWS,
            tuple((f"max by (module) ({_rows(fam)})", fam.replace("_", " ")) for fam in _FAMILIES),
            w=24,
            h=12,
            instant=True,
        )
    )
    # Rows with no parameters of their own (a container, the root) have nothing to share: left out.
    unsharded = f"({m('module_parameter_unsharded_bytes')} > 0)"
    panels.append(
        Panel(
            "Sharded modules: share held per rank",
            "table",
            "percentunit",
            "Under FSDP2 or tensor parallelism each rank holds a shard of a module's parameters: is blocks.3 small, "
            "or does this rank hold 1/8 of it? The largest and smallest share of each module held by one rank "
            "(1 / world size when evenly sharded; 1 for a module left whole)." + _ROWS,
            (
                (f"max by (module) ({_rows('parameter')} / {unsharded})", "largest share"),
                (f"min by (module) ({_rows('parameter')} / {unsharded})", "smallest share"),
            ),
            w=12,
            h=10,
            instant=True,
        )
    )
    panels.append(
        Panel(
            "Sharded modules: unsharded size",
            "table",
            "bytes",
            "How large is each module's parameter set unsharded: what FSDP2 all-gathers for its forward and backward?"
            + _ROWS,
            ((f"max by (module) ({scoped(unsharded, detail=True)})", "unsharded"),),
            w=12,
            h=10,
            instant=True,
        )
    )
    return panels


def _ranks() -> list[Panel]:
    peak, limit = m("memory_peak_bytes"), m("memory_limit_bytes")
    # Peers are the ranks of one training run on one kind of device, as in the alert rules; the
    # run's every rank, whatever ranks are selected: a rank is compared with its whole run.
    peers = ", ".join((*PEER_LABELS, "device_kind"))
    run_peak = by_kind(with_run(peak, ranks=False))
    # What MemexporterRankImbalance measures (on the step peak, without its median smoothing).
    steps = f"rate({m('steps_total')}[$__rate_interval])"
    excess = (
        f"topk($topk, ({by_kind(with_run(peak))} - on ({peers}) group_left () "
        f"quantile by ({peers}) (0.5, {run_peak})) / ignoring (device_kind, run_id) {limit})"
    )
    return [
        Panel(
            "Step peak per rank",
            "bargauge",
            "bytes",
            "Do the ranks peak at the same level? The last step's peak per rank, side by side: the Top K "
            "highest among the selected ranks.",
            ((f"topk($topk, {scoped(peak)})", "r{{rank}} {{device}}"),),
            instant=True,
        ),
        Panel(
            "Excess over the median rank",
            "bargauge",
            "percentunit",
            "How far above the median rank of its training run (same job, namespace and run_id, all its ranks) "
            "does each selected rank peak, as a share of its own limit? The Top K. This is what the "
            "MemexporterRankImbalance alert watches (it smooths with a median over time).",
            ((excess, "r{{rank}} {{device}}"),),
            instant=True,
            thresholds=(("green", None), ("orange", 0.1), ("red", 0.25)),
        ),
        Panel(
            "Rank closest to its limit",
            "stat",
            "percentunit",
            "Which rank runs out of memory first? The largest step peak / limit across the selected ranks and devices.",
            ((f"topk(1, {scoped(peak)} / {limit})", "rank {{rank}} {{device}}"),),
            w=8,
            instant=True,
            thresholds=(("green", None), ("orange", 0.8), ("red", 0.9)),
        ),
        Panel(
            "Peak / limit per rank",
            "bargauge",
            "percentunit",
            "How full is each rank at its step peak? step peak / limit per rank and device: the Top K "
            "fullest among the selected ranks.",
            ((worst(), "r{{rank}} {{device}}"),),
            w=16,
            instant=True,
            thresholds=(("green", None), ("orange", 0.8), ("red", 0.9)),
        ),
        Panel(
            "Step peak per rank over time",
            "timeseries",
            "bytes",
            "When did the ranks diverge? The step peak of the Top K highest selected ranks over time (the "
            "highest at the end of the time range: the same ranks over the whole range).",
            ((top(peak), "r{{rank}} {{device}}"),),
        ),
        # From the per-run record (one series per run and device kind): the same max - min over the
        # raw peaks of 1,024 ranks took 9 s a refresh over 6 h.
        Panel(
            "Peak spread across ranks (max - min)",
            "timeseries",
            "percentunit",
            "How far apart are the highest and lowest rank's step peaks, per training run (job, namespace, "
            "run_id) and device kind (cpu, cuda)? As a share of the limit: the highest minus the lowest "
            "peak utilisation (step peak over the level window / limit) among the run's ranks "
            "(run_device_kind:memexporter_memory_peak_utilisation:spread).",
            (
                (
                    run_rule("run_device_kind:memexporter_memory_peak_utilisation:spread"),
                    "{{job}} {{namespace}} {{run_id}} {{device_kind}}",
                ),
            ),
            run_wide=True,
            thresholds=(("green", None), ("orange", 0.1), ("red", 0.25)),
        ),
        Panel(
            "Steps per second per rank",
            "timeseries",
            "ops",
            "Is a rank lagging behind? Step rate per rank, the Top K slowest of the selected ranks; in "
            "data-parallel jobs they should match. The slowest at the end of the time range: the same ranks "
            "over the whole range.",
            ((top(steps, "bottomk", KEY), "r{{rank}}"),),
            w=24,
        ),
    ]


def build() -> dict[str, JSON]:
    """``{filename: dashboard JSON}`` for every dashboard."""
    return {
        "memexporter-overview.json": dashboard(
            "memexporter-overview",
            "Overview",
            overview(),
            [alerts_annotation(), fatal_oom_annotation(), phases_annotation()],
        ),
        "memexporter-modules.json": dashboard("memexporter-modules", "Modules", _modules(), detail_ranks=True),
        "memexporter-ranks.json": dashboard("memexporter-ranks", "Ranks", _ranks()),
    }
