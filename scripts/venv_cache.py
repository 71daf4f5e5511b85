"""The test command's virtual environment, kept outside the clone so that the next clone links it in.

A fresh clone's set-up built ``.venv`` in 46 CPU-s (2026-11-28, 2 cores: the venv and its pip, torch's
CPU wheel, the ``[dev]`` extra), and the test command's bytecode step took 25 more. The same checkout
makes the same venv, so the test command keeps the venv it built here once its tests passed (bytecode
and all), less memexporter's own editable install, and a later clone's ``setup.sh --test`` makes
``.venv`` from it with hard links (``cp -al``: 65,000 entries in under a CPU-second), then installs
memexporter itself (editable, no dependencies): 6.5 CPU-s for the set-up, 12 for the bytecode step::

    python3 scripts/venv_cache.py restore VENV   make VENV from the cache; exit 1 when there is no usable entry
    python3 scripts/venv_cache.py save VENV      keep VENV, built by this clone's set-up, unless an entry is there
    python3 scripts/venv_cache.py forget         drop this checkout's entry (a venv linked from it did not import)
    python3 scripts/venv_cache.py where          the entry this checkout would use, and whether it is there

Run it with the interpreter the venv is made from (``scripts/setup.sh``: ``$PYTHON``, else ``python3``).

- Where: ``$MEMEXPORTER_VENV_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/memexporter/venv``;
  ``MEMEXPORTER_VENV_CACHE=0`` turns it off (the set-up installs as it always did).
- The key is what decides the venv's contents: ``pyproject.toml``, ``scripts/setup.sh`` (torch's pin)
  and this script, the base interpreter (its prefix and version), the platform, and the set-up's torch
  variables (``MEMEXPORTER_TORCH_VERSION``, ``MEMEXPORTER_TORCH_INDEX``).
- Only a venv that ``setup.sh`` built from nothing is saved (it writes ``BUILT``, the time, then), and an
  entry serves for ``MAX_AGE_DAYS`` from that build: what ``pyproject.toml`` leaves open, pip resolves
  again at least weekly, so a dependency's new release that breaks the suite shows within a week. A
  restored venv has no ``BUILT`` and is never saved again; a developer's venv, updated in place, neither.
  The newest ``KEEP`` entries are kept.
- Hard links share files between the venvs. Python writes bytecode to a new file and renames it; pip
  removes files and writes new ones. The files a venv may rewrite as its own (``bin/``'s text files and
  ``pyvenv.cfg``, which also hold its path) are new files in each copy. An edit of a file in
  ``site-packages`` in place (an editor that keeps hard links) would reach the cache and every clone
  linked to it: reinstall that package with ``pip install --force-reinstall``, or delete the cache.
- Where hard links cannot be made (the cache on another file system than the clone), it says so in one
  line and the set-up installs as without a cache.
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
BUILT = ".memexporter-built"  # scripts/setup.sh's: the time it built this venv from nothing
MAX_AGE_DAYS = 7.0
KEEP = 2
ENTRY = "entry.json"


def say(line: str) -> None:
    """One line, as scripts/setup.sh's ``say`` prints it."""
    print(f"\033[1m[setup]\033[0m {line}", flush=True)


def root() -> Path | None:
    """The cache's folder (absolute), None when it is turned off."""
    given = os.environ.get("MEMEXPORTER_VENV_CACHE", "")
    if given == "0":
        return None
    if given:
        return Path(given).expanduser().absolute()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").absolute() / "memexporter" / "venv"


def key(repo: Path | None = None) -> str:
    """The entry's name: a hash of what decides the venv's contents (the module docstring)."""
    repo = repo or REPO
    files = [repo / "pyproject.toml", repo / "scripts" / "setup.sh", repo / "scripts" / "venv_cache.py"]
    facts = {
        "files": [hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else None for f in files],
        "python": [sys.base_prefix, sys.version],
        "platform": [platform.system(), platform.machine()],
        "torch": [os.environ.get("MEMEXPORTER_TORCH_VERSION", ""), os.environ.get("MEMEXPORTER_TORCH_INDEX", "")],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def meta(entry: Path) -> dict[str, object] | None:
    """The entry's ``entry.json`` (``built``: the venv's build time; ``path``: its venv's path as saved)."""
    try:
        found = json.loads((entry / ENTRY).read_text())
        float(found["built"])
        return found if isinstance(found, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fresh(entry: Path, now: float | None = None) -> bool:
    """Whether ``entry`` is complete and its venv was built less than ``MAX_AGE_DAYS`` ago."""
    found = meta(entry)
    age = (now if now is not None else time.time()) - float(found["built"]) if found else None  # type: ignore[arg-type]
    return age is not None and age < MAX_AGE_DAYS * 86400 and (entry / "venv").is_dir()


@contextlib.contextmanager
def locked(folder: Path, exclusive: bool) -> Iterator[None]:
    """The cache's lock: shared while a venv is linked from it, exclusive while entries come and go."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def link(source: Path, target: Path) -> str | None:
    """``cp -al source target`` (a venv, hard-linked); None when done, else why not in one line."""
    if os.stat(source).st_dev != os.stat(target.parent).st_dev:
        return f"{source} and {target.parent} are on different file systems: no hard links between them"
    out = subprocess.run(["cp", "-al", str(source), str(target)], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        return (out.stderr.strip().splitlines() or [f"cp exited {out.returncode}"])[0]
    return None


def retarget(venv: Path, old: str, new: str) -> None:
    """Write ``bin/``'s text files and ``pyvenv.cfg`` as new files, with ``old`` (a venv's absolute path)
    as ``new``: a venv rewrites them as its own (``python -m venv --upgrade``), so no copy shares them.
    ``RuntimeError`` when ``old`` is still there after (a path spelled another way)."""
    for path in [*(p for p in (venv / "bin").iterdir() if p.is_file() and not p.is_symlink()), venv / "pyvenv.cfg"]:
        data = path.read_bytes()
        if b"\0" in data:
            continue  # a binary (ruff's): its bytes stay as they are
        tmp = path.with_name(f".{path.name}.retarget")
        tmp.write_bytes(data.replace(old.encode(), new.encode()))
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
        if old != new and old.encode() + b"/" in path.read_bytes():  # a #! line still names the old venv
            raise RuntimeError(f"{path} still names {old}")


def uninstall(venv: Path, name: str = PACKAGE) -> list[str]:
    """Remove ``name``'s installed files from ``venv`` as its ``RECORD`` lists them (and their bytecode,
    and the folders they leave empty), then its ``.dist-info``: what ``pip uninstall`` does, without
    starting pip. Returns the removed paths, relative to ``venv``."""
    top, removed = venv.resolve(), []
    for site in venv.glob("lib/python*/site-packages"):
        for info in site.glob(f"{name}-*.dist-info"):
            with contextlib.suppress(FileNotFoundError), open(info / "RECORD", newline="") as f:
                for rel in [row[0] for row in csv.reader(f) if row]:
                    path = (site / rel).resolve()
                    if not path.is_relative_to(top) or path.is_relative_to(info.resolve()):
                        continue
                    for target in [
                        path,
                        *(path.parent.glob(f"__pycache__/{path.stem}.*.pyc") if rel.endswith(".py") else []),
                    ]:
                        if target.exists():
                            target.unlink()
                            removed.append(str(target.relative_to(top)))
                    for folder in (path.parent / "__pycache__", path.parent):
                        with contextlib.suppress(OSError):  # not empty, or gone: as it is
                            if folder.resolve() != site.resolve() and folder.is_relative_to(site.resolve()):
                                folder.rmdir()
            shutil.rmtree(info)
            removed.append(str(info.relative_to(venv)))
    return removed


def restore(venv: Path) -> int:
    """Make ``venv`` (which must not exist) from this checkout's entry: 0 done, 1 not (nothing is left)."""
    folder = root()
    entry = folder / key() if folder is not None else None
    if entry is None or venv.exists() or not fresh(entry):
        return 1  # an existing folder: setup.sh makes the venv over it, as without a cache
    target = venv.absolute()
    with locked(entry.parent, exclusive=False):
        found = meta(entry)
        if found is None or not fresh(entry):  # pruned meanwhile
            return 1
        why = link(entry / "venv", target)
    if why is not None:
        say(f"the cached venv was not linked into {venv} ({why}): installing instead")
        return 1
    try:
        retarget(target, str(found.get("path") or entry / "venv"), str(target))
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(target, ignore_errors=True)
        say(f"the cached venv {entry} did not fit {venv} ({exc}): installing instead")
        return 1
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(found["built"])))  # type: ignore[arg-type]
    say(f"{venv} linked from the cached venv {entry} (built {built}; MEMEXPORTER_VENV_CACHE=0: none)")
    return 0


def save(venv: Path) -> int:
    """Keep ``venv`` as this checkout's entry when setup.sh built it from nothing (``BUILT``) with this
    interpreter, unless a fresh entry is there; prune the old ones. Says why not only where that is news."""
    folder = root()
    source = venv.resolve()  # a symlinked venv: its folder, never the link (cp -al would copy the link)
    try:
        built = float((source / BUILT).read_text())
        config = (source / "pyvenv.cfg").read_text()
    except (OSError, ValueError):
        return 0  # restored, updated in place, or not setup.sh's: nothing to keep
    if folder is None or time.time() - built >= MAX_AGE_DAYS * 86400:
        return 0
    if (
        f"version = {platform.python_version()}" not in config
        and f"version_info = {platform.python_version()}" not in config
    ):
        say(f"the venv was not cached: {venv} is not of this Python ({platform.python_version()})")
        return 0
    entry = folder / key()
    with locked(folder, exclusive=True):
        if fresh(entry):
            return 0
        tmp = folder / f".saving-{entry.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        why = link(source, tmp / "venv")
        if why is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            say(f"the venv was not cached in {folder} ({why})")
            return 0
        uninstall(tmp / "venv")
        for name in (STAMP, BUILT):
            (tmp / "venv" / name).unlink()
        # pytest's rewritten plugins keep the path they were compiled at (its loader does not fix it).
        for pyc in (tmp / "venv").glob("lib/python*/site-packages/**/__pycache__/*-pytest-*.pyc"):
            pyc.unlink()
        retarget(tmp / "venv", str(source), str(entry / "venv"))  # the entry's own path, once renamed
        (tmp / ENTRY).write_text(json.dumps({"built": built, "path": str(entry / "venv"), "from": str(source)}) + "\n")
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("action", choices=("restore", "save", "forget", "where"))
    parser.add_argument("venv", nargs="?", type=Path, default=Path(".venv"))
    args = parser.parse_args(argv)
    if args.action == "restore":
        return restore(args.venv)
    if args.action == "save":
        return save(args.venv)
    folder = root()
    entry = folder / key() if folder is not None else None
    if args.action == "forget":
        if entry is not None and entry.exists():
            with locked(entry.parent, exclusive=True):
                shutil.rmtree(entry, ignore_errors=True)
            say(f"dropped the cached venv {entry}")
        return 0
    print(entry if entry is not None else "off (MEMEXPORTER_VENV_CACHE=0)", "(there)" if entry and fresh(entry) else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
