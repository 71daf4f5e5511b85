"""The test command's virtual environment, kept outside the clone so that the next clone links it in.

A fresh clone's set-up spent about 65 CPU-s on ``.venv`` (2026-11-28, 2 cores): the venv module and its
pip (6), pip's upgrade (3), torch's CPU wheel (14), the ``[dev]`` extra's dependencies (35), then the test
command's bytecode for what the suite imports (``scripts/warm_bytecode.py``: 15 of its 25). The same
``pyproject.toml`` makes the same venv, so the test command keeps its finished venv here (after the
bytecode), less memexporter's own editable install, and a later clone's set-up makes ``.venv`` from it
with hard links (``cp -al``: 65,000 entries in under a CPU-second), then installs memexporter itself
(editable, no dependencies: 1.5 CPU-s)::

    python3 scripts/venv_cache.py restore VENV   make VENV from the cache; exit 1 when there is no usable entry
    python3 scripts/venv_cache.py save VENV      keep VENV in the cache, unless a fresh entry is there already
    python3 scripts/venv_cache.py where          the entry this checkout would use, and whether it is there

Run it with the interpreter the venv is made from (``scripts/setup.sh``: ``$PYTHON``, else ``python3``).

- Where: ``$MEMEXPORTER_VENV_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/memexporter/venv``;
  ``MEMEXPORTER_VENV_CACHE=0`` turns it off (the set-up installs as it always did).
- The key is what decides the venv's contents: ``pyproject.toml``, the base interpreter (its prefix and
  version), the platform, and the set-up's torch pin and index (``MEMEXPORTER_TORCH_VERSION``,
  ``MEMEXPORTER_TORCH_INDEX``).
- An entry older than ``MAX_AGE_DAYS`` is not used: what ``pyproject.toml`` leaves open, pip resolves
  again at least that often, so a dependency's new release that breaks the suite shows within a week.
  The newest ``KEEP`` entries are kept.
- Hard links share files between the venvs. Nothing writes into an installed file in place: Python
  writes bytecode to a new file and renames it; pip removes files and writes new ones. The files that
  hold the venv's own path (``bin/``'s scripts and activate scripts, ``pyvenv.cfg``) are rewritten as new
  files in each copy. Where hard links cannot be made (the cache on another file system), ``restore``
  says so and the set-up installs as without a cache.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "memexporter"  # the checkout's own package: never in the cache, each clone installs its own
STAMP = ".memexporter-setup"  # scripts/setup.sh's record of what it installed, for this clone only
MAX_AGE_DAYS = 7.0
KEEP = 2
ENTRY = "entry.json"


def say(line: str) -> None:
    """One line, as scripts/setup.sh's ``say`` prints it."""
    print(f"\033[1m[setup]\033[0m {line}", flush=True)


def root() -> Path | None:
    """The cache's folder, None when it is turned off."""
    given = os.environ.get("MEMEXPORTER_VENV_CACHE", "")
    if given == "0":
        return None
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memexporter" / "venv"


def key(repo: Path | None = None) -> str:
    """The entry's name: a hash of what decides the venv's contents (the module docstring)."""
    facts = {
        "pyproject": hashlib.sha256(((repo or REPO) / "pyproject.toml").read_bytes()).hexdigest(),
        "python": [sys.base_prefix, sys.version],
        "platform": [platform.system(), platform.machine()],
        "torch": [os.environ.get("MEMEXPORTER_TORCH_VERSION", ""), os.environ.get("MEMEXPORTER_TORCH_INDEX", "")],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def fresh(entry: Path, now: float | None = None) -> bool:
    """Whether ``entry`` is complete and younger than ``MAX_AGE_DAYS``."""
    try:
        saved = float(json.loads((entry / ENTRY).read_text())["saved"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return (now if now is not None else time.time()) - saved < MAX_AGE_DAYS * 86400 and (entry / "venv").is_dir()


@contextlib.contextmanager
def locked(folder: Path, exclusive: bool) -> Iterator[None]:
    """The cache's lock: shared while a venv is linked from it, exclusive while entries come and go."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def retarget(venv: Path, old: str, new: str) -> int:
    """Rewrite ``old`` (a venv's absolute path) as ``new`` in the files that hold it: ``bin/``'s text
    files (the scripts' ``#!`` lines, the activate scripts) and ``pyvenv.cfg``. Each is written as a
    new file, so a hard-linked original stays as it was. Returns how many were rewritten."""
    candidates = [p for p in (venv / "bin").iterdir() if p.is_file() and not p.is_symlink()]
    count = 0
    for path in [*candidates, venv / "pyvenv.cfg"]:
        data = path.read_bytes()
        if b"\0" in data or old.encode() not in data:
            continue  # a binary (ruff's), or nothing to change
        tmp = path.with_name(f".{path.name}.retarget")
        tmp.write_bytes(data.replace(old.encode(), new.encode()))
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
        count += 1
    return count


def uninstall(venv: Path, name: str = PACKAGE) -> list[str]:
    """Remove ``name``'s installed files from ``venv`` as its ``RECORD`` lists them (and their bytecode),
    then its ``.dist-info``: what ``pip uninstall`` does, without starting pip. Returns the removed paths."""
    removed: list[str] = []
    for site in venv.glob("lib/python*/site-packages"):
        for info in site.glob(f"{name}-*.dist-info"):
            with open(info / "RECORD", newline="") as f:
                paths = [row[0] for row in csv.reader(f) if row]
            for rel in paths:
                path = (site / rel).resolve()
                if not path.is_relative_to(venv.resolve()) or path.is_relative_to(info.resolve()):
                    continue
                targets = [path]
                if path.suffix == ".py":
                    targets += path.parent.glob(f"__pycache__/{path.stem}.*.pyc")
                for target in targets:
                    if target.exists():
                        target.unlink()
                        removed.append(str(target.relative_to(venv.resolve())))
            shutil.rmtree(info)
            removed.append(str(info.relative_to(venv)))
    return removed


def restore(venv: Path) -> int:
    """Make ``venv`` (which must not exist) from this checkout's entry: 0 done, 1 no usable entry."""
    folder = root()
    if folder is None:
        return 1
    entry = folder / key()
    if not fresh(entry):
        return 1
    with locked(folder, exclusive=False):
        if not fresh(entry):  # pruned meanwhile
            return 1
        target = venv.absolute()
        out = subprocess.run(
            ["cp", "-al", str(entry / "venv"), str(target)], check=False, capture_output=True, text=True
        )
        if out.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            say(f"the cached venv cannot be linked into {venv} ({out.stderr.strip()}): installing instead")
            return 1
    retarget(target, str(entry / "venv"), str(target))
    saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(json.loads((entry / ENTRY).read_text())["saved"])))
    say(f"{venv} linked from the cached venv {entry} (saved {saved}; MEMEXPORTER_VENV_CACHE=0: none)")
    return 0


def save(venv: Path) -> int:
    """Keep ``venv`` as this checkout's entry, unless a fresh one is there; prune the old ones."""
    folder = root()
    if folder is None or not (venv / "pyvenv.cfg").is_file():
        return 0
    entry = folder / key()
    if fresh(entry):
        return 0
    with locked(folder, exclusive=True):
        if fresh(entry):
            return 0
        tmp = folder / f".saving-{entry.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        out = subprocess.run(
            ["cp", "-al", str(venv.absolute()), str(tmp / "venv")], check=False, capture_output=True, text=True
        )
        if out.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            say(f"the venv was not cached: cannot link {venv} into {folder} ({out.stderr.strip()})")
            return 0
        uninstall(tmp / "venv")
        (tmp / "venv" / STAMP).unlink(missing_ok=True)
        retarget(tmp / "venv", str(venv.absolute()), str(entry / "venv"))  # the entry's own path, once renamed
        (tmp / ENTRY).write_text(json.dumps({"saved": time.time(), "from": str(venv.absolute())}) + "\n")
        if entry.exists():
            shutil.rmtree(entry)  # stale
        os.rename(tmp, entry)
        prune(folder)
    say(f"cached the venv in {entry}: the next clone's set-up links it (MEMEXPORTER_VENV_CACHE=0: none)")
    return 0


def prune(folder: Path, keep: int = KEEP) -> list[str]:
    """Remove the entries past the newest ``keep`` fresh ones, and any stale or half-saved one (under the lock)."""
    entries = [p for p in folder.iterdir() if p.is_dir()]
    live = sorted((p for p in entries if fresh(p)), key=lambda p: (p / ENTRY).stat().st_mtime, reverse=True)
    gone = [p for p in entries if p not in live[:keep]]  # a .saving-* folder here is a killed save's: none runs
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in gone]


def main(argv: list[str] | None = None) -> int:
    """The command line (the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("restore", "save", "where"))
    parser.add_argument("venv", nargs="?", type=Path, default=Path(".venv"))
    args = parser.parse_args(argv)
    if args.action == "restore":
        if args.venv.exists():
            parser.error(f"{args.venv} exists: restore makes a new venv")
        return restore(args.venv)
    if args.action == "save":
        return save(args.venv)
    folder = root()
    entry = folder / key() if folder is not None else None
    print(entry if entry is not None else "off (MEMEXPORTER_VENV_CACHE=0)", "(there)" if entry and fresh(entry) else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
