"""scripts/torch_versions.py's bookkeeping, without running a version: the requirements read from
pyproject.toml (so that any Python can start the early action) are the installed metadata's, and the
early action's claim and outcome are honoured by the later actions of the same test command."""

from __future__ import annotations

import importlib.util
import json
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture
def tv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """The script as a module, its logs and venv cache in ``tmp_path`` (the running command's are in build/)."""
    spec = importlib.util.spec_from_file_location("torch_versions", REPO_ROOT / "scripts" / "torch_versions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "torch_versions", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "LOGS", tmp_path / "logs")
    monkeypatch.setenv("MEMEXPORTER_TEST_TORCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MEMEXPORTER_TEST_TORCH_VERSIONS", raising=False)
    return module


def test_the_requirements_from_pyproject_are_the_installed_metadatas(
    tv: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        installed = metadata.requires("memexporter")
    except metadata.PackageNotFoundError:
        pytest.skip("memexporter is not installed here: no metadata to compare pyproject.toml with")
    for version in tv.VERSIONS:
        from_pyproject = tv.requirements(version)
        monkeypatch.setattr(tv, "_declared", lambda: installed)
        assert tv.requirements(version) == from_pyproject, version.torch  # else every venv would set up again
        monkeypatch.undo()
    assert any(req.startswith("lightning") for req in from_pyproject)  # the extras are followed


def test_an_early_version_without_its_venv_is_left_to_the_others(
    tv: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tv.main(["early"]) == 0
    assert "not set up, or out of date: it runs with the others" in capsys.readouterr().out
    assert not list((tv.LOGS).glob("early-*.json"))  # no claim: setup and run take it


def test_an_early_version_is_left_to_the_others_where_its_requirements_cannot_be_read(
    tv: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Python 3.10 has no tomllib: the requirements come from the installed package, absent before the set-up.
    early = next(v for v in tv.VERSIONS if v.early)
    python = tv.venv_dir(early) / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)

    def absent() -> list[str]:
        raise metadata.PackageNotFoundError("memexporter")

    monkeypatch.setattr(tv, "_declared", absent)
    assert tv.main(["early"]) == 0
    assert "not set up, or out of date" in capsys.readouterr().out
    assert not list(tv.LOGS.glob("early-*.json"))


@pytest.mark.parametrize(("done", "ok", "rc"), [(True, True, 0), (True, False, 1), (False, False, 1)])
def test_run_after_early_reports_the_early_outcome_and_runs_nothing_else(
    tv: ModuleType, done: bool, ok: bool, rc: int
) -> None:
    early = next(v for v in tv.VERSIONS if v.early)
    tv.LOGS.mkdir(parents=True)
    said = {"done": done, "torch": early.torch, "ok": ok, "outcome": "passed: 1 passed", "failures": []}
    (tv.LOGS / tv.EARLY.format(early.torch)).write_text(json.dumps(said))
    assert tv.main(["run", "--checked", "--after-early", "--only", early.torch]) == rc
    summary = (tv.LOGS / "summary.txt").read_text()
    said_first = "passed: 1 passed" if done else "the early run did not finish"  # its claim names the version
    assert summary.startswith(f"[torch {early.torch}] {said_first}")
    assert not list(tv.LOGS.glob("torch-*.log"))  # nothing ran
