"""The documentation site builds with ``mkdocs build --strict`` (mkdocs.yml at the repository root):
every page in the nav, every link and anchor found. A broken link or a page left out of the nav
fails the build, so the test command catches them before a reader does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import REPO_ROOT

pytestmark = pytest.mark.integration

ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's notice about MkDocs 2.0, not ours


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the [dev] extra has it)")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        check=False,
        cwd=REPO_ROOT,
    )  # snippets: from the root


def nav_pages(nav: list[object]) -> list[str]:
    pages: list[str] = []
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            pages += nav_pages(value) if isinstance(value, list) else [str(value)]
    return pages


def test_the_site_builds_strict_with_every_page(tmp_path: Path) -> None:
    config = REPO_ROOT / "mkdocs.yml"
    done = build(config, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    pages = nav_pages(yaml.safe_load(config.read_text())["nav"])
    assert sorted(pages) == sorted(p.name for p in (REPO_ROOT / "docs").glob("*.md"))
    for page in pages:
        built = tmp_path / "site" / ("index.html" if page == "index.md" else f"{page.removesuffix('.md')}/index.html")
        assert built.is_file(), page


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("[a page that is not there](nowhere.md)", "nowhere.md"),
        ("[an anchor that is not there](sweep.md#no-such-section)", "no-such-section"),
    ],
)
def test_a_broken_link_fails_the_build(tmp_path: Path, change: str, said: str) -> None:
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + f"\n{change}\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and said in done.stdout + done.stderr, done.stdout + done.stderr


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "orphan.md" in done.stdout + done.stderr, done.stdout + done.stderr
