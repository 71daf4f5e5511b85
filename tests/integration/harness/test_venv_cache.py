"""scripts/venv_cache.py: the test command's venv kept outside the clone, and linked into the next one.

The venvs here are real ones (``python -m venv --without-pip``, a few milliseconds), holding
memexporter's editable install as pip wrote it in this checkout's venv (its ``RECORD``, ``.pth``
file, finder and console script), a dependency's console script, and what scripts/setup.sh writes
(its stamp, and ``BUILT`` when it built the venv from nothing). A restored venv is run: its interpreter
and its scripts find their own ``sys.prefix``, and neither the cache nor the saved venv changed."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import REPO_ROOT

pytestmark = pytest.mark.integration

PREFIX = "import sys; print(sys.prefix)"
DAY = 86400.0


@pytest.fixture
def vc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """The script as a module, its cache in ``tmp_path / "cache"``."""
    spec = importlib.util.spec_from_file_location("venv_cache", REPO_ROOT / "scripts" / "venv_cache.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("MEMEXPORTER_VENV_CACHE", str(tmp_path / "cache"))
    return module


def _installed_memexporter() -> Path:
    """This checkout's venv's ``memexporter-*.dist-info`` (pip's editable install), inside the repository."""
    prefix = Path(sys.prefix).resolve()
    infos = sorted(prefix.glob("lib/python*/site-packages/memexporter-*.dist-info"))
    if not infos or not prefix.is_relative_to(REPO_ROOT.resolve()):
        pytest.skip(f"no editable memexporter install in a venv inside the checkout (sys.prefix {sys.prefix})")
    return infos[0]


def make_venv(path: Path, built_days_ago: float | None = 0.0) -> Path:
    """A real venv at ``path`` with memexporter installed as pip installed it here, a dependency's console
    script (``dep``: prints its ``sys.prefix``), a binary in ``bin/`` holding the path, setup.sh's stamp,
    and its ``BUILT`` (None: not built from nothing by setup.sh)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next(path.glob("lib/python*/site-packages"))
    info = _installed_memexporter()
    shutil.copytree(info, site / info.name)
    for rel in (row.split(",")[0] for row in (info / "RECORD").read_text().splitlines() if row):
        source, target = (info.parent / rel).resolve(), (site / rel).resolve()
        if not target.is_relative_to(path.resolve()) or target.is_relative_to((site / info.name).resolve()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        if target.suffix == ".py":
            (target.parent / "__pycache__").mkdir(exist_ok=True)
            (target.parent / "__pycache__" / f"{target.stem}.cpython-311.pyc").write_bytes(b"bytecode")
    (site / "__pycache__").mkdir(exist_ok=True)
    (site / "__pycache__" / "xdist.cpython-311-pytest-9.1.1.pyc").write_bytes(path.absolute().as_posix().encode())
    dep = path / "bin" / "dep"
    dep.write_text(f"#!{path.absolute()}/bin/python\n{PREFIX}\n")
    dep.chmod(0o755)
    (path / "bin" / "tool").write_bytes(b"\x7fELF\0" + str(path.absolute()).encode())  # ruff's binary, say
    (path / ".memexporter-setup").write_text("hash [dev] /somewhere\n")
    if built_days_ago is not None:
        (path / ".memexporter-built").write_text(f"{time.time() - built_days_ago * DAY:.0f}\n")
    return path


def files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_built_venv_is_saved_then_restored_runnable_and_neither_copy_changes_the_other(
    vc: ModuleType, tmp_path: Path
) -> None:
    first = make_venv(tmp_path / "clone1" / ".venv")
    before = files(first)
    assert vc.save(first) == 0
    entry = tmp_path / "cache" / vc.key() / "venv"
    # memexporter is each clone's own, and so is what setup.sh wrote; pytest's rewritten plugins name their old path.
    assert (
        not list(entry.glob("lib/python*/site-packages/*memexporter*")) and not (entry / "bin" / "memexporter").exists()
    )
    assert not list(entry.glob(".memexporter-*")) and not list(entry.rglob("*-pytest-*.pyc"))
    assert (entry / "bin" / "dep").read_text().startswith(f"#!{entry}/bin/python\n")
    assert (entry / "bin" / "tool").read_bytes().endswith(str(first.absolute()).encode())  # a binary is left alone
    assert files(first) == before, "saving changed the saved venv"
    assert (first / "bin" / "dep").stat().st_ino != (entry / "bin" / "dep").stat().st_ino
    cached = files(entry)

    second = tmp_path / "clone2" / ".venv"
    second.parent.mkdir()
    assert vc.restore(second) == 0
    for run in ([str(second / "bin" / "python"), "-c", PREFIX], [str(second / "bin" / "dep")]):
        out = subprocess.run(run, capture_output=True, text=True, check=True)
        assert Path(out.stdout.strip()) == second.absolute(), run
    assert str(second.absolute()) in (second / "pyvenv.cfg").read_text()  # its "command" line
    assert (second / "bin" / "tool").stat().st_ino == (entry / "bin" / "tool").stat().st_ino  # linked, not copied
    for own in ("dep", "activate"):  # the files a venv rewrites as its own are its own
        assert (second / "bin" / own).stat().st_ino != (entry / "bin" / own).stat().st_ino
    assert (second / "pyvenv.cfg").stat().st_ino != (entry / "pyvenv.cfg").stat().st_ino
    assert files(entry) == cached and files(first) == before, "a rewrite reached another copy"
    assert vc.save(second) == 0 and files(entry) == cached, "a restored venv is never saved again"


def test_only_a_venv_setup_built_this_week_is_saved_and_only_a_fresh_entry_restored(
    vc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    assert vc.save(make_venv(tmp_path / "updated" / ".venv", built_days_ago=None)) == 0
    assert vc.save(make_venv(tmp_path / "old" / ".venv", built_days_ago=8)) == 0
    assert not cache.exists() or not list(cache.iterdir())
    assert vc.restore(tmp_path / "from-nothing") == 1
    assert vc.save(make_venv(tmp_path / "clone" / ".venv", built_days_ago=6)) == 0
    entry = cache / vc.key()
    other = tmp_path / "other"
    (other / "scripts").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "pyproject.toml", other)
    shutil.copy(REPO_ROOT / "scripts" / "venv_cache.py", other / "scripts")
    (other / "scripts" / "setup.sh").write_text(
        (REPO_ROOT / "scripts" / "setup.sh").read_text().replace("2.13.0", "2.14.0")
    )
    monkeypatch.setattr(vc, "REPO", other)
    assert vc.key() != entry.name and vc.restore(tmp_path / "from-a-new-torch-pin") == 1
    monkeypatch.setattr(vc, "REPO", REPO_ROOT)
    assert vc.fresh(entry) and not vc.fresh(entry, now=time.time() + 1.01 * DAY)  # 7 days from the build
    meta = json.loads((entry / "entry.json").read_text())
    (entry / "entry.json").write_text(json.dumps({**meta, "built": meta["built"] - 1.01 * DAY}))
    assert vc.restore(tmp_path / "from-stale") == 1
    monkeypatch.setenv("MEMEXPORTER_VENV_CACHE", "0")
    assert vc.root() is None and vc.restore(tmp_path / "off") == 1
    assert not any((tmp_path / name).exists() for name in ("from-nothing", "from-a-new-torch-pin", "from-stale", "off"))


def test_a_symlinked_venv_is_saved_from_its_folder_which_stays_whole(vc: ModuleType, tmp_path: Path) -> None:
    real = make_venv(tmp_path / "real")
    (tmp_path / "clone").mkdir()
    (tmp_path / "clone" / ".venv").symlink_to(real)
    before = files(real)
    assert vc.save(tmp_path / "clone" / ".venv") == 0
    entry = tmp_path / "cache" / vc.key() / "venv"
    assert entry.is_dir() and not entry.is_symlink() and (entry / "bin" / "dep").read_text().startswith(f"#!{entry}/")
    assert files(real) == before


def test_no_link_across_file_systems_one_line_says_so(
    vc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert vc.save(make_venv(tmp_path / "clone" / ".venv")) == 0
    capsys.readouterr()
    real_stat = os.stat

    def elsewhere(path: Any, *args: Any, **kwargs: Any) -> Any:  # the clone's folder on another device
        st = real_stat(path, *args, **kwargs)
        if Path(path) == tmp_path / "clone2":
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev + 1, *tuple(st)[3:]))
        return st

    (tmp_path / "clone2").mkdir()
    monkeypatch.setattr(vc.os, "stat", elsewhere)
    assert vc.restore(tmp_path / "clone2" / ".venv") == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "different file systems" in out[0] and "installing instead" in out[0]
    assert not (tmp_path / "clone2" / ".venv").exists()


def test_only_the_newest_fresh_entries_are_kept_and_forget_drops_this_ones(vc: ModuleType, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for name, age_days in (("old1", 1), ("old2", 2), ("stale", 9)):
        (cache / name / "venv").mkdir(parents=True)
        (cache / name / "entry.json").write_text(json.dumps({"built": time.time() - age_days * DAY}))
        os.utime(cache / name / "entry.json", (time.time() - age_days * DAY,) * 2)
    (cache / ".saving-x-1").mkdir()  # a killed save's
    assert vc.save(make_venv(tmp_path / "clone" / ".venv")) == 0
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted([vc.key(), "old1"])
    assert vc.main(["forget"]) == 0 and sorted(p.name for p in cache.iterdir() if p.is_dir()) == ["old1"]
    (tmp_path / "exists").mkdir()
    assert vc.restore(tmp_path / "exists") == 1  # setup.sh makes its venv over it, as without a cache
