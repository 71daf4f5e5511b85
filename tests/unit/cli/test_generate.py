"""One command for every generated file (memexporter/cli/generate.py): it finds a stale file of
each family, writes back exactly what is committed, and the docs list every file it makes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memexporter.cli import generate

ROOT = generate.CHECKOUT


def checkout_copy(tmp_path: Path) -> Path:
    """The generated files and the docs pages that hold generated blocks, copied under tmp_path."""
    for name in generate.GENERATED:
        for rel in generate.GENERATED[name].render(ROOT):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_the_committed_files_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--check"]) == 0, capsys.readouterr().err


def test_check_finds_one_stale_file_of_each_family_and_a_write_restores_the_committed_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = checkout_copy(tmp_path)
    edited = {
        "alerts/memexporter.rules.yml": "an edit by hand\n",
        "grafana/dashboards/memexporter-overview.json": "{}\n",
        "deploy/kubernetes/dashboards.yaml": "",
    }
    for rel, text in edited.items():
        (root / rel).write_text(text, encoding="utf-8")
    page = root / "docs/metrics.md"
    page.write_text(page.read_text(encoding="utf-8").replace("| gauge |", "| counter |", 1), encoding="utf-8")
    (root / "deploy/kubernetes/prometheusrule.yaml").unlink()  # a missing file is stale too

    assert generate.main(["--check", "--root", str(root)]) == 1
    said = capsys.readouterr().err
    stale = {*edited, "docs/metrics.md", "deploy/kubernetes/prometheusrule.yaml"}
    assert {line.split(" is stale")[0] for line in said.splitlines()} == stale
    assert (root / "alerts/memexporter.rules.yml").read_text(encoding="utf-8") == "an edit by hand\n"  # not written

    assert generate.main(["--root", str(root)]) == 0
    assert {line.removeprefix("wrote ") for line in capsys.readouterr().out.splitlines()} == stale
    for rel in stale:
        assert (root / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    assert generate.main(["--check", "--root", str(root)]) == 0


def test_one_family_by_name_and_a_typo_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = checkout_copy(tmp_path)
    (root / "alerts/memexporter.rules.yml").write_text("x\n", encoding="utf-8")
    assert generate.main(["--check", "--root", str(root), "dashboards", "docs"]) == 0  # not their files
    assert generate.main(["--check", "--root", str(root), "rules"]) == 1
    with pytest.raises(SystemExit) as exit_:
        generate.main(["dashbaords"])
    assert exit_.value.code == 2
    assert "no generated files named 'dashbaords' (did you mean dashboards?)" in capsys.readouterr().err


def test_a_file_that_cannot_be_written_is_one_line_and_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = checkout_copy(tmp_path)
    shutil.rmtree(root / "alerts")
    (root / "alerts").write_text("a file where the folder should be\n")  # fails for root too
    assert generate.main(["rules", "--root", str(root)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "alerts" in err and "Traceback" not in err, err


def test_the_docs_list_every_generated_file() -> None:
    listed = (ROOT / "docs/development.md").read_text(encoding="utf-8")
    for name, family in generate.GENERATED.items():
        for rel in family.render(ROOT):
            shown = rel if not rel.startswith("grafana/dashboards/") else "grafana/dashboards/*.json"
            shown = shown if not rel.startswith("docs/") else Path(rel).name
            assert f"`{shown}`" in listed, f"docs/development.md's generated files table lacks {shown} ({name})"
