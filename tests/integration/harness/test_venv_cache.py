"""scripts/venv_cache.py: the test command's venv kept outside the clone, and linked into the next one.

The venvs here are real ones (``python -m venv --without-pip``, a few milliseconds), holding
memexporter's editable install as pip wrote it in this checkout's venv (its ``RECORD``, ``.pth``
file, finder and console script) and a dependency's console script. A restored venv is run: its
interpreter and its scripts find their own ``sys.prefix``, and the cache's files are unchanged."""

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

import pytest

from tests.support import REPO_ROOT

pytestmark = pytest.mark.integration

PREFIX = "import sys; print(sys.prefix)"


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
    site = Path(sys.prefix).resolve()
    infos = sorted(site.glob("lib/python*/site-packages/memexporter-*.dist-info"))
    if not infos or not site.is_relative_to(REPO_ROOT.resolve()):
        pytest.skip(f"no editable memexporter install in a venv inside the checkout (sys.prefix {sys.prefix})")
    return infos[0]


def make_venv(path: Path) -> Path:
    """A real venv at ``path`` with memexporter installed as pip installed it here, a dependency's console
    script (``dep``: prints its ``sys.prefix``), a binary in ``bin/`` holding the path, and setup.sh's stamp."""
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
    dep = path / "bin" / "dep"
    dep.write_text(f"#!{path.absolute()}/bin/python\n{PREFIX}\n")
    dep.chmod(0o755)
    (path / "bin" / "tool").write_bytes(b"\x7fELF\0" + str(path.absolute()).encode())  # ruff's binary, say
    (path / ".memexporter-setup").write_text("hash [dev] /somewhere\n")
    return path


def test_a_saved_venv_is_restored_runnable_in_its_new_place_and_the_cache_is_untouched(
    vc: ModuleType, tmp_path: Path
) -> None:
    first = make_venv(tmp_path / "clone1" / ".venv")
    assert vc.save(first) == 0
    entry = tmp_path / "cache" / vc.key() / "venv"
    # memexporter is each clone's own; the dependencies, their scripts and the interpreter stay.
    assert not list(entry.glob("lib/python*/site-packages/*memexporter*"))
    assert not (entry / "bin" / "memexporter").exists() and not (entry / ".memexporter-setup").exists()
    assert (entry / "bin" / "dep").read_text().startswith(f"#!{entry}/bin/python\n")
    assert (entry / "bin" / "tool").read_bytes().endswith(str(first.absolute()).encode())  # a binary is left alone
    assert (first / "bin" / "memexporter").exists(), "the saved venv itself lost nothing"
    cached = {p: p.read_bytes() for p in entry.rglob("*") if p.is_file()}

    second = tmp_path / "clone2" / ".venv"
    second.parent.mkdir()
    assert vc.restore(second) == 0
    for run in ([str(second / "bin" / "python"), "-c", PREFIX], [str(second / "bin" / "dep")]):
        out = subprocess.run(run, capture_output=True, text=True, check=True)
        assert Path(out.stdout.strip()) == second.absolute(), run
    assert str(second.absolute()) in (second / "pyvenv.cfg").read_text()  # its "command" line
    assert {p: p.read_bytes() for p in entry.rglob("*") if p.is_file()} == cached, "a rewrite reached the cache"
    assert (second / "bin" / "tool").stat().st_ino == (entry / "bin" / "tool").stat().st_ino  # linked, not copied
    assert (second / "bin" / "dep").stat().st_ino != (entry / "bin" / "dep").stat().st_ino  # rewritten as a new file


def test_no_entry_for_another_pyproject_nor_a_stale_one_nor_with_the_cache_off(
    vc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = make_venv(tmp_path / "clone" / ".venv")
    assert vc.restore(tmp_path / "from-nothing") == 1
    assert vc.save(venv) == 0
    entry = tmp_path / "cache" / vc.key()
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text((REPO_ROOT / "pyproject.toml").read_text() + "\n# a new dependency\n")
    monkeypatch.setattr(vc, "REPO", other)
    assert vc.key() != entry.name and vc.restore(tmp_path / "from-other") == 1
    monkeypatch.setattr(vc, "REPO", REPO_ROOT)
    meta = json.loads((entry / "entry.json").read_text())
    (entry / "entry.json").write_text(json.dumps({**meta, "saved": time.time() - 8 * 86400}))
    assert not vc.fresh(entry) and vc.restore(tmp_path / "from-stale") == 1
    monkeypatch.setenv("MEMEXPORTER_VENV_CACHE", "0")
    assert vc.root() is None and vc.restore(tmp_path / "off") == 1 and vc.save(venv) == 0
    assert not any((tmp_path / name).exists() for name in ("from-nothing", "from-other", "from-stale", "off"))


def test_a_stale_entry_is_saved_again_and_only_the_newest_are_kept(vc: ModuleType, tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "clone" / ".venv")
    cache = tmp_path / "cache"
    for name, age_days in (("old1", 1), ("old2", 2), ("stale", 9)):
        (cache / name / "venv").mkdir(parents=True)
        (cache / name / "entry.json").write_text(json.dumps({"saved": time.time() - age_days * 86400}))
        os.utime(cache / name / "entry.json", (time.time() - age_days * 86400,) * 2)
    (cache / ".saving-x-1").mkdir()  # a killed save's
    assert vc.save(venv) == 0
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted([vc.key(), "old1"])


def test_restore_refuses_an_existing_folder(vc: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        vc.main(["restore", str(tmp_path)])
