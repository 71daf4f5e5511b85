"""The layout of the tests themselves, read from the files: ``tests/unit/`` mirrors the package and
starts nothing real; what starts a real binary, a subprocess or a server it waits on lives in
``tests/integration/`` (docs/development.md, "Where a test goes").

- every folder under ``tests/unit/`` names a package or module of ``memexporter/``
  (``tests/unit/backends/`` is ``memexporter/backends/``; ``tests/unit/tracking/`` holds
  ``test_steps.py`` for ``memexporter/tracking/steps.py``);
- a test file at the top of ``tests/unit/`` is named after a top-level module
  (``test_units.py``) or is one of the checks of the whole repository below;
- no file in ``tests/unit/`` imports what starts a process or a server: ``subprocess``,
  ``multiprocessing``, a server module, or the harness modules that start Prometheus, promtool,
  Alertmanager, VictoriaMetrics, chromium, the demo or another command (``STARTERS``).

The in-process exporter on a port the kernel picks (``memexporter.start(port=0)``) is allowed: it
is the code under test, and answers at once. So is ``tests.support.tls``, whose openssl writes a
certificate file and exits; and ``os.fork`` of a child that reports back and exits.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO_ROOT

UNIT = REPO_ROOT / "tests" / "unit"
PACKAGE = REPO_ROOT / "memexporter"

# Module -> None (the whole module) or the names whose use starts something real.
STARTERS: dict[str, frozenset[str] | None] = {
    "subprocess": None,
    "multiprocessing": None,
    "torch.multiprocessing": None,  # torch_mp.spawn: real ranks, waited on
    "http.server": None,
    "socketserver": None,
    "tests.support.binaries": None,  # require("promtool"), ...: a real binary runs next
    "tests.support.prometheus": None,
    "tests.support.alertmanager": None,
    "tests.support.victoriametrics": None,
    "tests.support.browser": None,  # chromium
    "tests.support.process": None,  # any command, waited on until its endpoints answer
    "tests.support.demo": None,  # memexporter demo, alone or under torchrun
    "tests.support.healthy_demo": None,  # the demo's loop in forked processes
    "tests.support.hostile": None,  # clients that hold the exporter's port for seconds
    "tests.support.probe": None,  # promtool test rules, at every evaluation
    "tests.support.ranksim_server": None,  # one loopback server per simulated rank
    "tests.support.promql": frozenset({"promtool_check_exprs"}),
    "tests.support.rank_exposition": frozenset({"generate", "expositions"}),  # a fresh interpreter each
    "tests.support.otlp": frozenset({"OtlpHttpReceiver", "grpc_receiver"}),
}

# The test files at the top of tests/unit/ that check the whole repository, not one module.
WHOLE_REPOSITORY = {
    "test_test_layout.py": "this file: the tests' own layout",
    "test_layers.py": "the package's layering: which module may import which",
    "test_import_cycles.py": "no import cycle anywhere in the package",
    "test_file_sizes.py": "no module over 300 lines, no test file over 450",
    "test_never_harm.py": "no module calls what changes what the user measures",
    "test_benchmarks_import.py": "every benchmark in benchmarks/ imports",
    "test_debugging_try_it.py": "the demo command of docs/debugging.md against the knobs",
    "test_fixture_recorder.py": "the GPU fixture recorder (tests/cuda/record_fixtures.py) on CPU",
    "test_recorded_fixtures.py": "the fixtures in tests/fixtures/ through the real backends",
}


def _folders() -> list[Path]:
    return sorted(p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__")


def _unit_files() -> list[Path]:
    return sorted(UNIT.rglob("*.py"))


def starters_imported(path: Path) -> list[str]:
    """What of ``STARTERS`` the file imports, anywhere in it (an import inside a function counts)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                for module, names in STARTERS.items():
                    if names is None and (alias.name == module or alias.name.startswith(module + ".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = STARTERS.get(node.module, frozenset())
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                if names is None or alias.name in names or STARTERS.get(whole, frozenset()) is None:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    return found


def mirrors(folder: Path) -> bool:
    """Whether ``tests/unit/<rel>/`` names ``memexporter/<rel>/`` (a package) or ``memexporter/<rel>.py``."""
    target = PACKAGE / folder.relative_to(UNIT)
    return (target / "__init__.py").is_file() or target.with_suffix(".py").is_file()


def top_level_modules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}


def test_unit_tests_start_no_process_or_server() -> None:
    found = {str(p.relative_to(UNIT)): starters_imported(p) for p in _unit_files()}
    strays = {name: lines for name, lines in found.items() if lines}
    assert not strays, (
        f"files in tests/unit/ that import what starts a process or a server: {strays}; "
        "a test that does belongs in tests/integration/"
    )


def test_every_unit_folder_names_a_package_or_module() -> None:
    strays = [str(f.relative_to(UNIT)) for f in _folders() if not mirrors(f)]
    assert not strays, f"tests/unit/ folders that name no package or module of memexporter/: {strays}"


def test_every_top_level_unit_test_names_a_top_level_module_or_says_what_it_checks() -> None:
    modules = top_level_modules()
    strays = [
        p.name
        for p in sorted(UNIT.glob("test_*.py"))
        if p.name not in WHOLE_REPOSITORY
        and not any(p.stem == f"test_{m}" or p.stem.startswith(f"test_{m}_") for m in modules)
    ]
    assert not strays, (
        f"files at the top of tests/unit/ named after no top-level module: {strays}; a test of "
        "memexporter/<sub>/<module>.py goes to tests/unit/<sub>/test_<module>.py; "
        "a check of the whole repository is listed in WHOLE_REPOSITORY with what it checks"
    )


def test_the_guard_sees_a_starter(tmp_path: Path) -> None:
    # The checks above must not pass vacuously.
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os\n"
        "from tests.support.promql import metric_names, promtool_check_exprs\n"
        "from tests.support import binaries\n"
        "def f():\n    import subprocess\n"
    )
    assert [line.split(": ", 1)[1] for line in starters_imported(probe)] == [
        "from tests.support.promql import promtool_check_exprs",
        "from tests.support import binaries",
        "import subprocess",
    ]
    assert mirrors(UNIT / "backends") and mirrors(UNIT / "tracking" / "steps")
    assert not mirrors(UNIT / "modules_of_nothing")
