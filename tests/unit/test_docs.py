"""``python -m memexporter.docs``: it re-renders the README's generated tables in place, and
``--check`` tells a stale README from a fresh one (what a contributor runs after a change)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memexporter import docs
from tests.support import REPO_ROOT


def stale_copy(tmp_path: Path) -> tuple[Path, str]:
    """The committed README with every generated block's body replaced by an old one."""
    fresh = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    stale = fresh
    for name in docs.BLOCKS:
        stale, n = re.subn(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", r"\1| old | table |\n\2", stale, flags=re.S)
        assert n == 1, f"README has no {name} block"
    path = tmp_path / "README.md"
    path.write_text(stale, encoding="utf-8")
    return path, fresh


def test_check_passes_on_the_committed_readme(capsys: pytest.CaptureFixture[str]) -> None:
    assert docs.main(["--check", "--readme", str(REPO_ROOT / "README.md")]) == 0
    assert capsys.readouterr().out == ""


def test_check_fails_on_a_stale_readme_and_a_run_renders_it_back(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path, fresh = stale_copy(tmp_path)
    assert docs.main(["--check", "--readme", str(path)]) == 1
    assert "stale" in capsys.readouterr().out
    assert docs.main(["--readme", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == fresh  # everything outside the blocks is kept


def test_a_readme_without_a_block_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text("# no generated tables here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="metrics:start"):
        docs.main(["--readme", str(path)])
