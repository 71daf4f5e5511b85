"""The size of every file, read from the files: each module of ``memexporter/`` at most 300 lines, each
Python file under ``tests/`` (the tests, their conftests, the harness in ``tests/support/``, the scripts
they run) at most 450 (the project's habit: about 50-250 lines a module, 300 at most; test files 450
at most; docs/development.md). A file past its limit is split along a seam, one concern a file, not
cut at a line count.

``ALLOWED`` names the files over their limit today that are being changed elsewhere, each with why it
may stay over; it can only shrink: an entry whose file is back under its limit (or gone) fails too,
so that it is removed with the split that made it unnecessary.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import REPO_ROOT

PACKAGE_LIMIT = 300
TEST_LIMIT = 450
# Where each limit applies: every .py file under these folders, at any depth.
LIMITS = {"memexporter": PACKAGE_LIMIT, "tests": TEST_LIMIT}

# Path from the repository root -> why it may stay over its limit for now.
ALLOWED: dict[str, str] = {}


def lines(path: Path) -> int:
    """Lines as ``wc -l`` counts them for a file that ends in a newline."""
    return len(path.read_text(encoding="utf-8").splitlines())


def sizes(root: Path = REPO_ROOT) -> dict[str, tuple[int, int]]:
    """``{path from root: (lines, limit)}`` for every file a limit applies to."""
    return {
        p.relative_to(root).as_posix(): (lines(p), limit)
        for folder, limit in LIMITS.items()
        for p in sorted((root / folder).rglob("*.py"))
    }


def oversized(root: Path = REPO_ROOT) -> dict[str, tuple[int, int]]:
    """The files over their limit, as ``sizes`` gives them."""
    return {path: (n, limit) for path, (n, limit) in sizes(root).items() if n > limit}


def described(files: dict[str, tuple[int, int]]) -> list[str]:
    return [f"{path} ({n} lines, limit {limit})" for path, (n, limit) in sorted(files.items())]


def test_no_file_exceeds_its_limit() -> None:
    over = {path: size for path, size in oversized().items() if path not in ALLOWED}
    assert not over, (
        f"files over their size limit: {described(over)}; split each along a seam (one concern a file, "
        "named for what it holds, its docstring saying where the rest went)"
    )


def test_the_allowed_files_are_still_over_their_limit() -> None:
    over = oversized()
    stale = sorted(path for path in ALLOWED if path not in over)
    assert not stale, f"ALLOWED names files no longer over their limit (or gone): {stale}; remove them from ALLOWED"
    assert all(reason.strip() for reason in ALLOWED.values()), "every allowed file says why"


def test_the_size_check_sees_an_oversized_file(tmp_path: Path) -> None:
    # The checks above must not pass vacuously: a file one line over its limit is found, one at it is not.
    for folder, name, n in (
        ("memexporter", "big.py", PACKAGE_LIMIT + 1),
        ("memexporter/sub", "fits.py", PACKAGE_LIMIT),
        ("tests/support", "big.py", TEST_LIMIT + 1),
        ("tests/unit", "test_fits.py", TEST_LIMIT),
    ):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / name).write_text("x = 1\n" * n, encoding="utf-8")
    assert described(oversized(tmp_path)) == [
        "memexporter/big.py (301 lines, limit 300)",
        "tests/support/big.py (451 lines, limit 450)",
    ]
    assert sizes()["memexporter/metrics/spec.py"][1] == PACKAGE_LIMIT
    assert sizes()["tests/unit/test_file_sizes.py"][1] == TEST_LIMIT
