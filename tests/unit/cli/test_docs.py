"""The docs tables (memexporter/cli/docs.py) through ``python -m memexporter.cli.generate docs``: it
re-renders the generated tables of the docs pages in place, and ``--check`` tells a stale page from
a fresh one (what a contributor runs after a change)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from memexporter.cli import docs, generate
from tests.support import REPO_ROOT


def stale_copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the docs folder with every generated block's body replaced by an old one."""
    folder = tmp_path / "docs"
    shutil.copytree(REPO_ROOT / "docs", folder)
    fresh = {}
    for name, (page, _) in docs.BLOCKS.items():
        path = folder / page
        fresh.setdefault(page, path.read_text(encoding="utf-8"))
        stale, n = re.subn(
            rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)",
            r"\1| old | table |\n\2",
            path.read_text(encoding="utf-8"),
            flags=re.S,
        )
        assert n == 1, f"{page} has no {name} block"
        path.write_text(stale, encoding="utf-8")
    return folder, fresh


def test_check_passes_on_the_committed_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["docs", "--check"]) == 0
    assert capsys.readouterr().err == ""


def test_check_fails_on_stale_pages_and_a_run_renders_them_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, fresh = stale_copy(tmp_path)
    assert generate.main(["docs", "--check", "--root", str(folder.parent)]) == 1
    said = capsys.readouterr().err
    assert all(f"{page} is stale" in said for page in fresh), said
    assert generate.main(["docs", "--root", str(folder.parent)]) == 0
    for page, text in fresh.items():
        assert (folder / page).read_text(encoding="utf-8") == text  # everything outside the blocks is kept


def test_a_page_without_its_block_is_an_error(tmp_path: Path) -> None:
    folder, _ = stale_copy(tmp_path)
    (folder / "metrics.md").write_text("# no generated tables here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"metrics:start.*metrics\.md"):
        generate.main(["docs", "--root", str(folder.parent)])
