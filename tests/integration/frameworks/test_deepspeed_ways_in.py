"""DeepSpeed's ways in (issue 42): the HF ``Trainer`` with a DeepSpeed config, accelerate's
``DeepSpeedPlugin``, and ``memexporter run`` on an unmodified ``deepspeed.initialize`` script. (Plain
``deepspeed.initialize`` with ``memexporter.track(engine, optimizer)``, on two ranks, is
test_deepspeed_zero.py.)

Each way is one process of one rank on DeepSpeed's CPU accelerator (gloo), as a user starts it
(scripts/deepspeed_script.py): it trains four optimizer steps of two micro-batches, then writes its
``/metrics`` beside the truth read from DeepSpeed's partitions with torch's API. One rank is enough
here: what two ranks change (each holds its partition) is the torchrun test's.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO_ROOT
from tests.support.demo import module_env
from tests.support.frameworks import Scrape, parse
from tests.support.ports import free_port
from tests.support.process import tail

# One process per way (a module-scoped fixture) serves its three tests: keep them on one xdist worker.
pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=70), pytest.mark.xdist_group("deepspeed_ways_in")]

# Found, not imported: DeepSpeed runs in the scripts' processes, never in the test process.
if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("needs DeepSpeed: pip install 'memexporter[frameworks]'", allow_module_level=True)

SCRIPT = Path(__file__).parent / "scripts" / "deepspeed_script.py"
STEPS = 4
TOLERANCE = 0.01
# The way, the framework it needs, and whether it runs under `memexporter run`.
WAYS = {"hf": ("transformers", False), "accelerate": ("accelerate", False), "plain": ("deepspeed", True)}


def launch(way: str, out: Path) -> tuple[Scrape, dict[str, Any]]:
    if importlib.util.find_spec(WAYS[way][0]) is None:
        pytest.skip(f"needs {WAYS[way][0]}: pip install 'memexporter[frameworks]'")
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    argv = [sys.executable, str(SCRIPT), way, str(out)]
    if WAYS[way][1]:
        port = free_port()
        env["METRICS_URL"] = f"http://127.0.0.1:{port}/metrics"
        argv = [sys.executable, "-m", "memexporter", "run", "--port", str(port), "--addr", "127.0.0.1", *argv[1:]]
    log = out / f"{way}.log"
    with log.open("w") as f:
        proc = subprocess.run(
            argv, env=module_env(env), cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=240, check=False
        )
    result = out / f"{way}.json"
    if proc.returncode != 0 or not result.exists():
        pytest.fail(f"{' '.join(argv)} exited {proc.returncode}:\n{tail(log)}")
    data = json.loads(result.read_text())
    return parse(data["metrics"]), data


@pytest.fixture(scope="module", params=list(WAYS))
def way(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Scrape, dict[str, Any]]:
    return (request.param, *launch(request.param, tmp_path_factory.mktemp(request.param)))


def unsharded(text: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    name = "memexporter_module_parameter_unsharded_bytes"
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def test_each_family_sums_to_what_deepspeed_holds(way: tuple[str, Scrape, dict[str, Any]]) -> None:
    name, got, data = way
    want = data["truth"]["families"]
    have = {f: got.total(f) for f in want if f != "parameter_unsharded"}
    if "parameter_unsharded" in want:  # ZeRO-3
        have["parameter_unsharded"] = unsharded(data["metrics"])
    off = {f: (have[f], want[f]) for f in want if abs(have[f] - want[f]) > TOLERANCE * want[f] or not want[f]}
    assert not off, f"{name}: family: (rows summed, DeepSpeed holds) {off}"


def test_every_module_has_a_row(way: tuple[str, Scrape, dict[str, Any]]) -> None:
    name, got, data = way
    modules = set(data["truth"]["modules"])
    assert len(modules) >= 5, modules  # the MLP: 8; GPT-2 at depth 3: wte, wpe, h.0, h.1, ln_f
    for family in ("parameter", "gradient", "optimizer_state"):
        rows = {m for m, v in got.rows[family].items() if v > 0}
        assert modules <= rows, f"{name} {family}: no bytes in the rows of {sorted(modules - rows)}"


def test_steps_are_the_engines_and_nothing_failed(way: tuple[str, Scrape, dict[str, Any]]) -> None:
    name, got, data = way
    assert data["global_steps"] == STEPS
    assert got.steps == STEPS, f"{name}: memexporter_steps_total {got.steps}, engine.global_steps {STEPS}"
    assert got.hook_errors == 0
    assert got.collector_success and all(v == 1 for v in got.collector_success.values()), got.collector_success
