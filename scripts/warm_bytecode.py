"""Write the bytecode of what the test suite imports, instead of the whole venv's.

The set-up installs with ``pip --no-compile`` (pip compiles one file at a time) and leaves the
bytecode to the test command, beside its lint. ``compileall`` over site-packages compiled 12,400
files in 61 CPU-s on 2 cores, for the ~3,600 that the suite's processes import: torch's compiler
stack, transformers' models, sympy's solvers, pip, mypy and the docs tools sit there unread. This
imports what the tests and their subprocesses import and writes each module's ``.pyc`` as it
loads (about 19 CPU-s on one core). Where ``PYTHONDONTWRITEBYTECODE`` is set (a CI image may set
it), nothing else writes bytecode, and every process would compile its imports again.

The test modules get theirs too: each pytest worker rewrites every test module's asserts at
collection and, under ``PYTHONDONTWRITEBYTECODE``, keeps nothing: 6.6 of a worker's 16 CPU-s of
collection. A collection here (``--collect-only``) writes pytest's rewritten ``.pyc`` files, which
pytest reads whatever that setting says.

Where torch's bytecode is there already (a second run, or a venv linked from the cache of
``scripts/venv_cache.py``), the imports are skipped: 4 CPU-s instead of 9 (2026-11-28).

A module left out costs only its own compile, in the process that imports it. Run by
``scripts/test.sh``: ``python scripts/warm_bytecode.py``; it never fails the run (a framework that
is not installed is skipped).
"""

from __future__ import annotations

import compileall
import contextlib
import importlib
import importlib.util
import io
import os
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = False  # the point of this script, whatever the environment says
os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed probes for CUDA otherwise

REPO = Path(__file__).resolve().parent.parent

# What the suite's processes import: the workers, the forked demos, torchrun's launcher and ranks,
# the framework runs (HF Trainer, Lightning, accelerate, DeepSpeed), the OTLP and browser tests.
MODULES = (
    "torch",
    "torch.nn",
    "torch.optim",
    "torch.multiprocessing",
    "torch.distributed",
    "torch.distributed.run",
    "torch.distributed.elastic.multiprocessing",
    "torch.distributed.fsdp",
    "torch.distributed._tools.mem_tracker",
    "torch.utils.checkpoint",
    "numpy",
    "transformers",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.trainer",
    "transformers.training_args",
    "lightning",
    "lightning.pytorch",
    "accelerate",
    "deepspeed",
    "deepspeed.ops",
    "deepspeed.ops.adam",
    "deepspeed.runtime.engine",
    "deepspeed.runtime.zero.stage3",
    "deepspeed.runtime.zero.stage_1_and_2",
    "prometheus_client",
    "yaml",
    "psutil",
    "pytest",
    "xdist",
    "selenium.webdriver",
    "opentelemetry.sdk.metrics",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
)


def _written(module: str) -> bool:
    """Whether ``module``'s bytecode is there (it need not be imported to say)."""
    spec = importlib.util.find_spec(module)
    return bool(spec and spec.origin and Path(importlib.util.cache_from_source(spec.origin)).exists())


def main() -> int:
    """Collect the tests, import each module (a missing one is skipped), then compile the checkout's
    own packages."""
    started = time.process_time()
    os.chdir(REPO)
    with contextlib.redirect_stdout(io.StringIO()):  # its "N tests collected" is not this script's news
        import pytest

        collected = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider"])
    skipped = [] if collected == 0 else [f"the tests' collection (exit {collected})"]
    # Where torch's bytecode is there already, so is the rest's (this wrote them together: a second run,
    # or a venv linked from scripts/venv_cache.py's cache): only the collection's is this clone's own.
    for name in [] if _written("torch") else MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # not installed, or no CPU backend: that module is left out
            skipped.append(name)
    # The checkout is installed editable: its modules are read from here by every subprocess.
    for package in ("memexporter", "tests"):
        compileall.compile_dir(str(REPO / package), quiet=1, workers=1)
    note = f"; skipped {', '.join(skipped)}" if skipped else ""
    print(f"[bytecode] {len(sys.modules)} modules in {time.process_time() - started:.0f} CPU-s{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
