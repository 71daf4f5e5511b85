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

Where this wrote them before (``DONE`` in the venv: a second run, or a venv linked from the cache of
``scripts/venv_cache.py``), the imports are skipped: 4 CPU-s instead of 9 (2026-11-28).

A module left out costs only its own compile, in the process that imports it. Run by
``scripts/test.sh``: ``python scripts/warm_bytecode.py``; it never fails the run (a framework that
is not installed is skipped).
"""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import importlib
import io
import os
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = False  # the point of this script, whatever the environment says
os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed probes for CUDA otherwise

REPO = Path(__file__).resolve().parent.parent
DONE = ".memexporter-bytecode"  # in the venv: the MODULES whose bytecode this wrote, as a hash

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


def _hash() -> str:
    return hashlib.sha256("\n".join(MODULES).encode()).hexdigest()


def todo(prefix: Path) -> tuple[str, ...]:
    """The modules to import in the venv at ``prefix``: none where this wrote their bytecode before (a
    second run, or a venv linked from scripts/venv_cache.py's cache; ``DONE`` says so), else ``MODULES``.
    Not torch's ``.pyc`` as the sign: the set-up writes torch's alone, and a run that took it for all
    compiled transformers, Lightning and DeepSpeed in every process (under ``PYTHONDONTWRITEBYTECODE``):
    its pytest took 12m51s where the one before took 9m47s (2026-11-28)."""
    try:
        done = (prefix / DONE).read_text().strip() == _hash()
    except OSError:
        done = False
    return () if done else MODULES


def main() -> int:
    """Collect the tests, import each module (a missing one is skipped), then compile the checkout's
    own packages."""
    started = time.process_time()
    os.chdir(REPO)
    with contextlib.redirect_stdout(io.StringIO()):  # its "N tests collected" is not this script's news
        import pytest

        collected = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider"])
    skipped = [] if collected == 0 else [f"the tests' collection (exit {collected})"]
    for name in todo(Path(sys.prefix)):
        try:
            importlib.import_module(name)
        except Exception:  # not installed, or no CPU backend: that module is left out
            skipped.append(name)
    with contextlib.suppress(OSError):
        (Path(sys.prefix) / DONE).write_text(_hash() + "\n")
    # The checkout is installed editable: its modules are read from here by every subprocess.
    for package in ("memexporter", "tests"):
        compileall.compile_dir(str(REPO / package), quiet=1, workers=1)
    note = f"; skipped {', '.join(skipped)}" if skipped else ""
    print(f"[bytecode] {len(sys.modules)} modules in {time.process_time() - started:.0f} CPU-s{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
