"""scripts/warm_bytecode.py names modules that exist in the dev venv: it skips a module that does not
import, so a misspelt or moved one would quietly leave its package to be compiled by every process
(under ``PYTHONDONTWRITEBYTECODE``). Checked from the files, without importing them."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

pytestmark = pytest.mark.integration


def _exists(dotted: str) -> bool:
    """A module's source is where its name says, below its top-level package (nothing imported; the
    top level may be a namespace package, as ``opentelemetry`` is)."""
    top, *rest = dotted.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    if not rest:
        return True
    for location in spec.submodule_search_locations or ():
        base = Path(location).joinpath(*rest)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def test_every_module_it_warms_is_installed() -> None:
    # Read, not run: the script turns bytecode writing on for the process that runs it.
    tree = ast.parse((REPO_ROOT / "scripts" / "warm_bytecode.py").read_text(encoding="utf-8"))
    modules = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODULES" for t in node.targets)
    )
    assert len(modules) >= 20
    assert [m for m in modules if not _exists(m)] == []
    assert not _exists("torch.no_such_module")  # the check can fail


def test_the_imports_are_skipped_only_where_it_wrote_them_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The set-up writes torch's bytecode alone: a run that took torch's .pyc as the sign skipped the rest, and
    # every process compiled transformers, Lightning and DeepSpeed again (pytest 12m51s, where it took 9m47s).
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)  # the script turns it off
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))  # and sets this
    spec = importlib.util.spec_from_file_location("warm_bytecode", REPO_ROOT / "scripts" / "warm_bytecode.py")
    assert spec is not None and spec.loader is not None
    wb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wb)
    torch_pyc = tmp_path / "lib" / "python3" / "site-packages" / "torch" / "__pycache__" / "__init__.cpython-311.pyc"
    torch_pyc.parent.mkdir(parents=True)
    torch_pyc.write_bytes(b"bytecode")
    assert wb.todo(tmp_path) == wb.MODULES
    (tmp_path / wb.DONE).write_text("a hash of another list of modules\n")
    assert wb.todo(tmp_path) == wb.MODULES
    (tmp_path / wb.DONE).write_text(wb._hash() + "\n")
    assert wb.todo(tmp_path) == ()
