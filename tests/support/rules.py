"""Rules files for a test, rendered where they are used (never committed beside the default).

``render_preset(folder, "demo")`` runs ``memexporter rules --preset demo --output ...`` in-process,
the command a user types, and returns the file: the short-window preset lives only in the test's
temporary folder, so ``alerts/`` stays safe to load whole."""

from __future__ import annotations

from pathlib import Path

from memexporter.cli import main
from tests.support import REPO_ROOT

DEFAULT_RULES = REPO_ROOT / "alerts" / "memexporter.rules.yml"
# The per-run records (issue 25's contract): what the rules record per run and the Overview's top
# reads. Written here by hand, not imported from the rules, so that a rename fails both tests.
RUN_RECORDS = (
    "run_device_kind:memexporter_memory_peak_utilisation:max",
    "run_device_kind:memexporter_memory_peak_utilisation:worst_rank",
    "run_device_kind:memexporter_memory_peak_utilisation:spread",
    "run_device_kind:memexporter_oom_eta_seconds:min",
    "run_device_kind:memexporter_memory_used_bytes:sum",
    "run_device_kind:memexporter_memory_limit_bytes:sum",
    "run_device_kind:memexporter_leak_rate_bytes_per_second:max",
    "run:memexporter_ranks:count",
)


def render_preset(folder: Path, preset: str = "demo", *options: str) -> Path:
    """``folder/memexporter.<preset>.rules.yml``, rendered by the ``memexporter rules`` CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"memexporter.{preset}.rules.yml"
    rc = main(["rules", "--preset", preset, *options, "--output", str(path)])
    if rc != 0 or not path.is_file():
        raise RuntimeError(f"memexporter rules --preset {preset} {' '.join(options)} failed (exit {rc})")
    return path
