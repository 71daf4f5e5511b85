"""``memexporter run`` on an unmodified HF ``Trainer`` script finds the model by itself (``auto_track``,
issue 22): module rows are exported and add up to the model; ``--max-modules`` and
``--module-depth`` apply to them; ``--no-auto-track`` and ``MEMEXPORTER_AUTO_TRACK=0`` turn it off.

Each case is one subprocess (``python -m memexporter run --port P --addr 127.0.0.1 ... script``);
the script (scripts/hf_trainer_script.py) imports nothing of memexporter and, at its end, reads
``/metrics`` over HTTP and writes it next to the model's figures. The search tracks the model at
its first optimizer step, from the next forward on; the script takes 6 steps, so gradients and
optimizer state are counted at the tracked handle's first step (step 2), always counted.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO_ROOT, forkserver
from tests.support.demo import module_env
from tests.support.frameworks import ADAMW_STEP_BYTES, WRAPPER_PART, Scrape, parse
from tests.support.ports import free_port
from tests.support.process import tail

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Only the script (a subprocess) imports transformers: looked for here, not imported, as importing it
# took 0.6 to 1.0 CPU-s of each pytest worker's collection.
if importlib.util.find_spec("transformers") is None:
    pytest.skip("needs transformers (pip install -e .[frameworks])", allow_module_level=True)

SCRIPT = Path(__file__).parent / "scripts" / "hf_trainer_script.py"


def run(tmp_path: Path, *options: str, env: dict[str, str] | None = None) -> tuple[Scrape, dict[str, Any]]:
    port = free_port()
    log = tmp_path / "run.log"
    argv = [
        sys.executable,
        "-m",
        "memexporter",
        "run",
        "--port",
        str(port),
        "--addr",
        "127.0.0.1",
        *options,
        str(SCRIPT),
        str(tmp_path),
    ]
    environ = module_env({"HF_SCRIPT_METRICS_URL": f"http://127.0.0.1:{port}/metrics", **(env or {})})
    with log.open("w") as f:
        proc = forkserver.popen(argv, env=environ, cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT)
    try:
        proc.wait(180)
    finally:
        proc.kill()  # nothing once it exited
    result = tmp_path / "result.json"
    if proc.returncode != 0 or not result.exists():
        pytest.fail(f"{' '.join(argv)} exited {proc.returncode}:\n{tail(log)}")
    data = json.loads(result.read_text())
    return parse(data["metrics"]), data


def check_run(got: Scrape, data: dict[str, Any]) -> None:
    """The exporter ran, counted every optimizer step, and no hook failed (a fresh process: 0)."""
    assert got.steps == data["global_step"], f"memexporter_steps_total {got.steps}, global_step {data['global_step']}"
    assert got.hook_errors == 0
    assert got.collector_success and all(v == 1 for v in got.collector_success.values()), got.collector_success


def check_totals(got: Scrape, data: dict[str, Any]) -> None:
    params, count = data["param_bytes"], data["param_count"]
    assert got.total("parameter") == params, got.rows["parameter"]
    assert got.total("gradient") == params, got.rows["gradient"]  # every parameter has a gradient
    adamw = 2 * params + ADAMW_STEP_BYTES * count
    assert abs(got.total("optimizer_state") - adamw) <= 0.001 * adamw, (got.total("optimizer_state"), adamw)
    assert got.total("activation") > 0, got.rows["activation"]


def test_run_finds_the_model(tmp_path: Path) -> None:
    got, data = run(tmp_path)
    check_run(got, data)
    assert got.module_series > 0, "memexporter run exported no module rows for an unmodified Trainer script"
    check_totals(got, data)
    labels = got.labels()
    assert not {label for label in labels if WRAPPER_PART.search(label)}, labels
    # The model found is the GPT2LMHeadModel itself (no prefix): its own module names label the rows.
    assert labels <= {*data["module_names"], "(root)"} - {""}, labels
    assert {"transformer.h.0", "transformer.h.1", "transformer.wte"} <= labels, labels


def test_run_max_modules_caps_the_rows(tmp_path: Path) -> None:
    got, data = run(tmp_path, "--max-modules", "3")
    check_run(got, data)
    for family, rows in got.rows.items():
        assert "(root)" in rows, (family, rows)
        assert 1 <= len(rows) <= 3 + 1, (family, rows)
    check_totals(got, data)  # folding moves bytes into ancestors, never drops them


def test_run_module_depth_applies(tmp_path: Path) -> None:
    got, data = run(tmp_path, "--module-depth", "1")
    check_run(got, data)
    labels = got.labels()
    assert labels and all("." not in label for label in labels), labels
    assert "transformer" in labels, labels
    check_totals(got, data)


@pytest.mark.parametrize(
    ("options", "env"), [(["--no-auto-track"], {}), ([], {"MEMEXPORTER_AUTO_TRACK": "0"})], ids=["flag", "env"]
)
def test_run_auto_track_off(tmp_path: Path, options: list[str], env: dict[str, str]) -> None:
    got, data = run(tmp_path, *options, env=env)
    check_run(got, data)
    assert got.module_series == 0, got.rows
