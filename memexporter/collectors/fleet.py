"""A rank among many: which run it belongs to, and how much it exports when the run is large.

**Run identity.** ``memexporter_run_info{run_id, run_id_source}`` names the training run so that
dashboards select one run and the rules compare the ranks of one run with no relabelling. The
launcher knows the run; ``run_identity`` asks it, first answer wins (``run_id_source`` says which):

- ``memexporter``: ``start(run_id=...)`` or ``MEMEXPORTER_RUN_ID`` (a Kubernetes pod sets it from
  the downward API: ``metadata.labels['batch.kubernetes.io/job-name']``);
- ``torchelastic``: ``TORCHELASTIC_RUN_ID``, torchrun's ``--rdzv-id`` (not its default, ``none``);
- ``slurm``: ``SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID`` for an array task, else ``SLURM_JOB_ID``;
- ``master``: ``MASTER_ADDR:MASTER_PORT``, the rendezvous every rank of a distributed run shares;
- ``process``: ``hostname-pid``, one process on its own.

**The detail at scale.** Under data parallelism every rank holds the same module table; at 1,024
ranks those copies were 84 % of all series. From ``FLEET_WORLD_SIZE`` ranks up, only the *detail
ranks* (``detail_ranks``, by default the first node's) export the detail: the module rows and the
spec rows marked ``detail`` (diagnostic or derivable figures), and the automatic phases
(forward/backward/optimizer: the anatomy of a step, the same on every rank). Every other rank
exports the *core set*: everything the alerts read. ``detail`` on ``run_info`` says which a rank is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import Metric

from memexporter.collectors.scrape import Identity
from memexporter.config.values import RANK_RANGE
from memexporter.metrics import BY_NAME, specs_for
from memexporter.tracking.phases import AUTOMATIC_PHASES

FLEET_WORLD_SIZE = 64
"""From this many ranks up, ``detail_ranks=auto`` keeps the detail to the first node's ranks."""

Detail = Literal["per_rank", "representative", "core"]


@dataclass(frozen=True)
class RunIdentity:
    """The run this process belongs to: ``run_id`` and where it came from (``source``)."""

    run_id: str
    source: str


def run_identity(
    configured: str = "", environ: Mapping[str, str] | None = None, hostname: str | None = None, pid: int | None = None
) -> RunIdentity:
    """The run's identity from the setting, then the launchers' variables (see the module doc)."""
    env = os.environ if environ is None else environ
    if configured:
        return RunIdentity(configured, "memexporter")
    elastic = env.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return RunIdentity(elastic, "torchelastic")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return RunIdentity(f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}", "slurm")
    if env.get("SLURM_JOB_ID"):
        return RunIdentity(env["SLURM_JOB_ID"], "slurm")
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return RunIdentity(f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", "master")
    host = socket.gethostname() if hostname is None else hostname
    return RunIdentity(f"{host}-{os.getpid() if pid is None else pid}", "process")


def detail_for(setting: str, rank: int, world_size: int, local_world_size: int) -> Detail:
    """What this rank exports: its own full set (``per_rank``), the full set standing for its peers
    (``representative``) or the ``core`` set, from ``detail_ranks`` (``setting``, as parsed)."""
    if setting == "all" or (setting == "auto" and world_size < FLEET_WORLD_SIZE):
        return "per_rank"
    if setting == "auto":
        chosen = rank < max(local_world_size, 1)
    elif setting == "none":
        chosen = False
    else:
        chosen = any(_in_range(rank, part) for part in setting.split(","))
    return "representative" if chosen else "core"


def _in_range(rank: int, part: str) -> bool:
    match = RANK_RANGE.fullmatch(part)
    if match is None:  # config.values.ranks has checked the setting; a bad part selects nothing
        return False
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    return low <= rank <= high


def is_detail_only(metric: str) -> bool:
    """Whether a family (by its exposition name, counters with or without ``_total``) is detail."""
    spec = BY_NAME.get(metric) or BY_NAME.get(metric + "_total")
    return spec is not None and spec.detail


def detail_only_collector(name: str) -> bool:
    """Whether every series a collector emits is detail (the module rows): a core rank skips it."""
    specs = specs_for(name)
    return bool(specs) and all(s.detail for s in specs)


def core(families: Iterable[Metric]) -> Iterator[Metric]:
    """The core set of ``families``: detail rows dropped, automatic phases out of the phase families."""
    for family in families:
        if is_detail_only(family.name):
            continue
        if family.name.startswith("memexporter_phase_"):
            family.samples = [s for s in family.samples if s.labels.get("phase") not in AUTOMATIC_PHASES]
            if not family.samples:
                continue
        yield family


def identity(
    environ: dict[str, str] | None = None,
    group: Callable[[], tuple[int, int] | None] | None = None,
    run_id: str = "",
    detail_ranks: str = "auto",
) -> Identity:
    """Rank, local rank and world size from torchrun's variables, falling back to Slurm and Open
    MPI, then to torch.distributed's initialised default group (``group``), then to one process;
    the run's identity and this rank's share of the detail (``fleet.py``)."""
    env = dict(os.environ if environ is None else environ)

    def first(*names: str, default: str) -> str:
        return next((env[n] for n in names if env.get(n)), default)

    if group is None:
        from memexporter.backends.cuda import process_group

        group = process_group
    pg = group()
    rank = first("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", default=str(pg[0]) if pg else "0")
    world_size = first("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", default=str(pg[1]) if pg else "1")
    local_world = first("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", default="1")
    run = run_identity(run_id, env)
    return Identity(
        rank=rank,
        local_rank=first("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default="0"),
        world_size=world_size,
        hostname=socket.gethostname(),
        run_id=run.run_id,
        run_id_source=run.source,
        detail=detail_for(detail_ranks, _number(rank), _number(world_size), _number(local_world)),
    )


def _number(text: str) -> int:
    """A count or rank from a launcher's variable; 0 when it is not a plain integer (Slurm writes
    ``8(x16)`` for tasks per node)."""
    head = text.split("(", maxsplit=1)[0].strip()
    return int(head) if head.isdigit() else 0
