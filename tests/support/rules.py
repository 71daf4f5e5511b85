"""Rules files for a test, rendered where they are used (never committed beside the default).

``render_preset(folder, "demo")`` runs ``memexporter rules --preset demo --output ...`` in-process,
the command a user types, and returns the file: the short-window preset lives only in the test's
temporary folder, so ``alerts/`` stays safe to load whole."""

from __future__ import annotations

from pathlib import Path

from memexporter.cli import main
from tests.support import REPO_ROOT

DEFAULT_RULES = REPO_ROOT / "alerts" / "memexporter.rules.yml"


def render_preset(folder: Path, preset: str = "demo", *options: str) -> Path:
    """``folder/memexporter.<preset>.rules.yml``, rendered by the ``memexporter rules`` CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"memexporter.{preset}.rules.yml"
    rc = main(["rules", "--preset", preset, *options, "--output", str(path)])
    if rc != 0 or not path.is_file():
        raise RuntimeError(f"memexporter rules --preset {preset} {' '.join(options)} failed (exit {rc})")
    return path
