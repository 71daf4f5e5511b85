"""One rank's real exposition, made by memexporter itself, for the rank simulator (``ranksim.py``).

    python -m tests.support.rank_exposition --world 1024 --rank 8 --run-id scale-bench

runs the exporter in this process on the demo's 12-layer GPT (76 tracked modules) for a few CPU
training steps, with ``torch.cuda`` and ``pynvml`` replaced by the stand-ins the tests use
(``cuda_standins.py``, ``nvml_standin.py``) answering from the SYNTHETIC A100-SXM4-80GB fixture
(``tests/fixtures/synthetic/a100_torch2.13_fraction.json``, its memory fraction set to 1.0): so the
rank has the ``cuda:0`` OOM view, the allocator and device families, and the ``cpu`` view. It prints
one JSON object: the exposition in OpenMetrics and in text format, as ``/metrics`` serves them.

``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are set as torchrun sets them, so
an exporter that knows the run (``memexporter_run_info``, ``detail_ranks``) filters its own output
(``own_filter`` in the JSON). For one that does not, ``adapt`` cuts the contract's core set
(``core_only``) and adds the info row (``with_run_info``).

``generate()`` runs it in a process of its own, forked from the worker's zygote (its memexporter
imported afresh: ``tests/support/forkserver.py``); ``source`` is another checkout's ``memexporter``
folder (``git archive`` of an older revision), for the exposition as it was then, in a fresh
interpreter.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from memexporter.metrics import SPECS
from tests.support import REPO_ROOT, forkserver
from tests.support.web import get_text

FIXTURE = "a100_torch2.13_fraction.json"
BEFORE = "de4f325"  # the last commit before issue 25: every rank exported everything
DETAIL_WORLD = 64  # from this world size up the contract keeps the detail to the first node
LOCAL_WORLD = 8  # ranks per node, as on an 8-GPU machine
RUN_INFO = "memexporter_run_info"
# The contract's detail families besides the module rows (memexporter_module_*), from the spec
# table: what an exporter that does not filter its own output (the --before one) must lose.
CONTRACT_DETAIL = frozenset(s.name for s in SPECS if s.detail and not s.name.startswith("memexporter_module_"))
AUTOMATIC_PHASES = ("forward", "backward", "optimizer")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?")


def generate(world: int, rank: int, run_id: str, source: Path | None = None, timeout: float = 300.0) -> dict[str, Any]:
    """The exposition of ``rank`` of ``world``, made in a fresh interpreter (see the module doc)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMEXPORTER_")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (source, REPO_ROOT) if p is not None)
    env.update({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    argv = [
        sys.executable,
        "-m",
        "tests.support.rank_exposition",
        "--world",
        str(world),
        "--rank",
        str(rank),
        "--run-id",
        run_id,
    ]
    done = forkserver.run(
        argv, env=env, cwd=source or REPO_ROOT, timeout=timeout, scripts=True
    )  # another source: fresh
    if done.returncode != 0:
        raise RuntimeError(f"rank_exposition failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def expositions(before: bool, world: int, run_id: str) -> dict[str, dict[str, Any]]:
    """Every kind of rank a run of ``world`` ranks has, made by the exporter: ``before`` (the
    exporter of ``BEFORE``, from ``git archive``), else ``per_rank`` below ``DETAIL_WORLD`` ranks,
    ``representative`` (rank 0) and ``core`` (rank 8) from there up."""
    if before:
        with tempfile.TemporaryDirectory(prefix="memexporter-before-") as tmp:
            archive = subprocess.run(
                ["git", "archive", BEFORE, "memexporter"], cwd=REPO_ROOT, check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            return {"before": generate(world, 0, run_id, source=Path(tmp))}
    if world < DETAIL_WORLD:
        return {"per_rank": generate(world, 0, run_id)}
    return {"representative": generate(world, 0, run_id), "core": generate(world, LOCAL_WORLD, run_id)}


def core_only(text: str, detail: frozenset[str] = CONTRACT_DETAIL) -> str:
    """The core set of an exposition (either format), by the contract: no module row, no line of a
    detail family (counters with or without ``_total``, as OpenMetrics names them), no automatic phase row."""
    keep, families = [], {n.removesuffix("_total") for n in detail}
    for line in text.splitlines():
        m = _SAMPLE.match(line.split(" ", 3)[2] if line.startswith(("# HELP ", "# TYPE ", "# UNIT ")) else line)
        name = m.group(1) if m else ""
        if name in detail or name.removesuffix("_total") in families or name.startswith("memexporter_module_"):
            continue
        if name.startswith("memexporter_phase_") and any(f'phase="{p}"' in line for p in AUTOMATIC_PHASES):
            continue
        keep.append(line)
    return "\n".join(keep) + "\n"


def with_run_info(text: str, rank: int, run_id: str, detail: str) -> str:
    """The contract's ``memexporter_run_info`` row added (a gauge of 1, as ``build_info``), before
    OpenMetrics' ``# EOF``: for an exporter that has no such row yet."""
    rows = (
        f"# HELP {RUN_INFO} The training run this rank belongs to (added by the rank simulator).\n"
        f"# TYPE {RUN_INFO} gauge\n"
        f'{RUN_INFO}{{detail="{detail}",rank="{rank}",run_id="{run_id}",run_id_source="memexporter"}} 1.0\n'
    )
    head, eof, _ = text.partition("# EOF")
    return head + rows + eof + ("\n" if eof else "")


def adapt(made: dict[str, Any], kind: str, run_id: str) -> dict[str, Any]:
    """An exposition from an exporter that does not filter itself made into ``kind``'s: the core
    set cut by the contract's list, and the run_info row added (for the exporter before issue 25, whose own output is ``kind`` "before" as it is)."""
    if made["own_filter"]:
        return made
    out = dict(made)
    for key in ("openmetrics", "text"):
        text = core_only(made[key]) if kind == "core" else made[key]
        out[key] = with_run_info(text, int(made["rank"]), run_id, kind) if kind != "before" else text
    return out


def _scrape(url: str, accept: str) -> str:
    return get_text(url, 30, headers={"Accept": accept, "Accept-Encoding": "identity"})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    os.environ.update(
        {
            "WORLD_SIZE": str(args.world),
            "RANK": str(args.rank),
            "LOCAL_RANK": str(args.rank % LOCAL_WORLD),
            "LOCAL_WORLD_SIZE": str(LOCAL_WORLD),
        }
    )
    import pytest
    import torch

    import memexporter
    from memexporter.cli.demo import TinyGPT
    from memexporter.metrics import BY_NAME
    from tests.support.cuda_standins import TorchStandIn, load
    from tests.support.nvml_standin import NvmlStandIn
    from tests.support.synthetic_fixtures import SYNTHETIC_DIR

    own = RUN_INFO in BY_NAME  # the exporter knows the run: it filters its own output
    if own:
        os.environ["MEMEXPORTER_RUN_ID"] = args.run_id
    answers = copy.deepcopy(load(SYNTHETIC_DIR / FIXTURE)["answers"])
    answers["devices"]["0"]["memory_fraction"] = 1.0  # the whole 80 GB device
    mp = pytest.MonkeyPatch()
    TorchStandIn(answers).install(mp)
    NvmlStandIn(answers["nvml"]).install(mp)
    torch.manual_seed(0)
    gpt = TinyGPT(layers=12)
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-3)
    exp = memexporter.start(port=0, addr="127.0.0.1", warmup_steps=0)
    memexporter.track(gpt, opt)
    for _ in range(args.steps):
        tokens = torch.randint(0, 512, (8, 65))
        loss = torch.nn.functional.cross_entropy(gpt(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    url = exp.url or ""
    out = {
        "openmetrics": _scrape(url, "application/openmetrics-text; version=1.0.0"),
        "text": _scrape(url, "text/plain; version=0.0.4"),
        "own_filter": own,
        "world": args.world,
        "rank": args.rank,
        "synthetic": "cuda:0 answers from the SYNTHETIC fixture " + FIXTURE,
    }
    memexporter.stop()
    mp.undo()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
