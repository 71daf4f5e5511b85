"""Per-module rows under DeepSpeed ZeRO 0, 1, 2 and 3, with and without offload (issue 42): optimizer
state offloaded to the host under ZeRO 1-3, and the parameter partitions too under ZeRO-3.

One ``torchrun --standalone --nproc-per-node=2`` launch (gloo, DeepSpeed's CPU accelerator) runs
every configuration in turn (scripts/zero_worker.py): ``deepspeed.initialize`` with two parameter
groups and two micro-batches per optimizer step, ``memexporter.track(engine, optimizer)``, three
optimizer steps, a scrape of the rank's own ``/metrics``, and beside it the truth read from
DeepSpeed's own partitions with torch's API (the tensors its torch optimizer steps, their ``.grad``
and state; ZeRO-3's ``ds_tensor``). Per rank, each family's rows add up to that truth within 1 %.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO_ROOT
from tests.support.demo import module_env
from tests.support.process import tail

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=50), pytest.mark.xdist_group("zero_modules")]

WORKER = Path(__file__).parent / "scripts" / "zero_worker.py"
WORLD = 2
STEPS = 3  # optimizer steps (engine.global_steps), of two micro-batches and two parameter groups each
ZERO = ["z0", "z1", "z2", "z3", "z1_offload", "z2_offload", "z3_offload"]
UNREADABLE = "z3_unreadable"
# The model tracked before initialize(), then a second engine over it after the first one's step:
# the rows are the new partitions', read again (the HF Trainer builds an engine per train()).
REBUILT = "z2_rebuild"
TOLERANCE = 0.01
FLAT = ("gradient", "optimizer_state")  # what ZeRO 1-3 keep in flat partitions; ZeRO-3 also the parameters

Ranks = list[dict[str, Any]]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ranks]:
    torch = pytest.importorskip("torch", reason="needs torch")
    if importlib.util.find_spec("deepspeed") is None:  # found, not imported: it runs in the ranks only
        pytest.skip("needs DeepSpeed: pip install 'memexporter[frameworks]'")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no torch.distributed with the gloo backend")
    out = tmp_path_factory.mktemp("zero")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}"]
    argv += [str(WORKER), str(out), ",".join([*ZERO, UNREADABLE, REBUILT])]
    log = out / "torchrun.log"
    env = module_env({"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"})
    with log.open("w") as f:
        proc = subprocess.run(
            argv, env=env, cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=300, check=False
        )
    files = [out / f"rank{r}.json" for r in range(WORLD)]
    if proc.returncode != 0 or not all(p.exists() for p in files):
        pytest.fail(f"torchrun exited {proc.returncode}:\n{tail(log)}")
    per_rank = [json.loads(p.read_text()) for p in files]
    by_config = {name: [ranks[name] for ranks in per_rank] for name in per_rank[0]}
    by_config["log"] = [{"text": log.read_text()}]
    return by_config


def ranks_of(results: dict[str, Ranks], config: str) -> Ranks:
    ranks = results[config]
    for r, res in enumerate(ranks):
        if "error" in res:
            pytest.fail(f"{config}, rank {r}: {res['error']}\n{res['traceback'][-3000:]}")
    return ranks


def truth(res: dict[str, Any]) -> dict[str, float]:
    """What DeepSpeed holds on this rank, per family: under ZeRO 1-3 the flat partitions' gradients,
    and their fp32 master weights plus state; under stage 0 the parameters' gradients and state."""
    return res["truth"]["families"]


def summed(res: dict[str, Any], family: str) -> float:
    return sum(res["after"]["rows"][family].values())


@pytest.mark.parametrize("config", [*ZERO, REBUILT])
def test_each_family_sums_to_what_deepspeed_holds_on_each_rank(results: dict[str, Ranks], config: str) -> None:
    for r, res in enumerate(ranks_of(results, config)):
        want = truth(res)
        got = {family: summed(res, family) for family in want}
        assert all(v > 0 for v in want.values()), f"rank {r}: the truth is empty: {want}"
        off = {f: (got[f], want[f]) for f in want if abs(got[f] - want[f]) > TOLERANCE * want[f]}
        assert not off, f"rank {r}: family: (rows summed, DeepSpeed holds) {off}"
        if not config.startswith("z3"):  # nothing sharded: no unsharded series
            assert not res["after"]["rows"]["parameter_unsharded"], f"rank {r}"


@pytest.mark.parametrize("config", [*ZERO, REBUILT])
def test_every_module_has_a_row_in_every_family(results: dict[str, Ranks], config: str) -> None:
    for r, res in enumerate(ranks_of(results, config)):
        modules = set(res["truth"]["modules"])
        assert len(modules) == 8, modules  # inp, 3 x (Linear, LayerNorm), head
        for family in ("parameter", "gradient", "optimizer_state"):
            rows = res["after"]["rows"][family]
            assert modules <= set(rows), f"rank {r} {family}: no row for {sorted(modules - set(rows))}"
        # Every rank holds part of every parameter under ZeRO-3: every module's row is above 0.
        if config.startswith("z3"):
            assert all(res["after"]["rows"]["parameter"][m] > 0 for m in modules), f"rank {r}"


@pytest.mark.parametrize("config", [*ZERO, UNREADABLE, REBUILT])
def test_steps_count_the_engines_optimizer_steps(results: dict[str, Ranks], config: str) -> None:
    """Two micro-batches and two parameter groups per step: the torch optimizer inside DeepSpeed
    steps twice per engine step, and the counter counts it once, as ``global_steps`` does."""
    for r, res in enumerate(ranks_of(results, config)):
        before, after = res["before"], res["after"]
        assert res["global_steps"] == STEPS
        assert after["steps"] - (before["steps"] or 0) == STEPS, f"rank {r}"
        assert after["hook_errors"] - (before["hook_errors"] or 0) == 0, f"rank {r}: hook errors"
        assert after["hook_errors"] == res["hook_errors_fn"]
        healthy = {k: v for k, v in after["success"].items() if k != "modules"}
        assert healthy and all(v == 1 for v in healthy.values()), after["success"]


@pytest.mark.parametrize("config", [*ZERO[1:], REBUILT])
def test_device_rows_say_where_deepspeed_keeps_each_family(results: dict[str, Ranks], config: str) -> None:
    """memexporter_module_device_bytes: summed over devices, each family's rows; the device is the
    one DeepSpeed's tensors are on (the host under offload_optimizer)."""
    for r, res in enumerate(ranks_of(results, config)):
        devices = res["truth"]["devices"]
        where: dict[str, dict[str, float]] = {}
        for key, value in res["after"]["rows"]["device"].items():
            module, family, device = key.split("|")
            where.setdefault(family, {}).setdefault(device, 0.0)
            where[family][device] += value
            assert value <= res["after"]["rows"][family][module], f"rank {r}: {key}"
        families = ("parameter", "gradient", "optimizer_state") if config.startswith("z3") else FLAT
        want_devices = {family: set(devices[family]) for family in families}
        assert {f: set(d) for f, d in where.items()} == want_devices, f"rank {r}"
        for family in want_devices:
            assert sum(where[family].values()) == summed(res, family), f"rank {r} {family}"


def test_unreadable_internals_leave_the_rows_out_with_the_reason(results: dict[str, Ranks]) -> None:
    """A ZeRO-3 optimizer without the map DeepSpeed 0.19 keeps (``grad_position``): training goes
    on, the gradient and optimizer-state rows are absent (not 0), the parameter rows stay right,
    the modules collector reads 0 and the reason is logged once on each rank."""
    for r, res in enumerate(ranks_of(results, UNREADABLE)):
        rows = res["after"]["rows"]
        assert not rows["gradient"] and not rows["optimizer_state"], f"rank {r}: {rows}"
        assert summed(res, "parameter") == truth(res)["parameter"] > 0
        assert res["before"]["success"]["modules"] == 1
        assert res["after"]["success"]["modules"] == 0, f"rank {r}"
    text = results["log"][0]["text"]
    reason = re.compile(r"memexporter: DeepSpeed [\d.]+: ZeRO-3 optimizer without grad_position")
    assert len(reason.findall(text)) == WORLD, text[-3000:]  # once per rank
