"""Every error of the file-writing commands is one line on stderr with exit status 1 (2 for
argparse's own usage errors), never a traceback: the commands run as subprocesses, as a user
runs them. Paths that cannot be written are built under ``tmp_path``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO_ROOT
from tests.support.demo import module_env

pytestmark = pytest.mark.integration


def run(*argv: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=module_env(),
        cwd=REPO_ROOT,
        check=False,
    )
    return done.returncode, done.stderr


@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A folder that cannot exist: its parent is a file (refused even to root)."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "sub"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["-m", "memexporter", "rules", "--output", "{missing}/x.yml"],
            "memexporter rules: cannot write '{missing}/x.yml': No such file or directory",
        ),
        (
            ["-m", "memexporter", "rules", "--output", "{tmp}"],
            "memexporter rules: cannot write '{tmp}': Is a directory",
        ),
        (["-m", "memexporter.rules", "--output", "{missing}/x.yml"], "memexporter rules: cannot write"),
        (
            ["-m", "memexporter", "dashboards", "--output", "{blocked}"],
            "memexporter dashboards: cannot write '{blocked}",
        ),
        (
            ["-m", "memexporter", "dashboards", "--format", "configmap", "--output", "{blocked}"],
            "memexporter dashboards: cannot write '{blocked}': Not a directory",
        ),
        (["-m", "memexporter.dashboards", "--out", "{blocked}"], "cannot write '{blocked}"),
    ],
    ids=[
        "rules-missing-dir",
        "rules-a-dir",
        "rules-module",
        "dashboards-json",
        "dashboards-configmap",
        "dashboards-module",
    ],
)
def test_a_path_that_cannot_be_written_is_one_line(argv: list[str], said: str, tmp_path: Path, blocked: Path) -> None:
    names = {"missing": str(tmp_path / "no" / "such" / "dir"), "tmp": str(tmp_path), "blocked": str(blocked)}
    code, err = run(*(a.format(**names) for a in argv))
    assert code == 1, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(said.format(**names)), err


@pytest.mark.parametrize(
    ("argv", "usage", "said"),
    [
        (
            ["run", "--prot", "9500", "x.py"],
            "usage: memexporter run ",
            "memexporter run: error: unrecognized arguments: --prot (did you mean --port?)",
        ),
        (["inspect", "--tpo", "3"], "usage: memexporter inspect ", "(did you mean --top?)"),
        (["run", "--wibble", "x.py"], "usage: memexporter run ", "unrecognized arguments: --wibble\n"),
    ],
)
def test_a_typo_in_a_subcommands_option_gets_that_subcommands_usage_and_the_option_meant(
    argv: list[str], usage: str, said: str
) -> None:
    # The top-level usage was printed, which lists the subcommands, not the option mistyped (issue 27).
    code, err = run("-m", "memexporter", *argv)
    assert code == 2 and err.startswith(usage) and said in err, err
