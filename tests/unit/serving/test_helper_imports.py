"""The helper process never imports torch (DESIGN.md §8): read from the source, every module the helper's
entry (``memexporter.serving.helper``) imports at run time, transitively, with the packages it passes
through; none may be torch, numpy, or a part of memexporter outside the helper's side of ``serving/``
(the job's side, ``serving/job/``, the collectors, tracking and the backends all reach torch). The
integration test ``test_helper_process.py`` looks at a running helper's memory maps as well."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.support import REPO_ROOT
from tests.unit.test_layers import imports

PACKAGE = REPO_ROOT / "memexporter"
ENTRY = "memexporter.serving.helper"
# Within memexporter, the helper may reach only these: the wire, the server, the spec table (a leaf).
ALLOWED = ("memexporter.serving.", "memexporter.metrics", "memexporter._version")
# Outside it: the standard library and prometheus_client (pure Python, a dependency already).
THIRD_PARTY = ("prometheus_client",)


def source(module: str) -> str | None:
    """The file of a memexporter module (a package's __init__), or None for anything else."""
    if not module.startswith("memexporter"):
        return None
    path = REPO_ROOT / module.replace(".", "/")
    if (path / "__init__.py").exists():
        return str(path / "__init__.py")
    return str(path.with_suffix(".py")) if path.with_suffix(".py").exists() else None


def top_level(path: Path) -> set[str]:
    """The modules ``path`` imports outside functions and ``if TYPE_CHECKING:``."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def closure() -> tuple[set[str], set[str]]:
    """(memexporter modules, other top-level modules) the entry imports at run time, transitively."""
    seen: set[str] = set()
    others: set[str] = set()
    todo = [ENTRY, "memexporter", "memexporter.serving"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        file = source(module)
        if file is None:
            if not module.startswith("memexporter"):
                others.add(module.split(".")[0])
            continue
        seen.add(module)
        if module == "memexporter":  # its __getattr__ imports the public API when asked for it: never here
            todo += sorted(top_level(Path(file)))
        else:  # imports inside functions count: a function may run
            todo += sorted(imports(Path(file), runtime_only=True))
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a.b.c runs a and a.b
    return seen, others


def test_the_helper_reaches_no_module_that_imports_torch() -> None:
    ours, others = closure()
    assert ENTRY in ours and "memexporter.serving.board" in ours
    outside = sorted(m for m in ours if m not in ("memexporter", "memexporter.serving") and not m.startswith(ALLOWED))
    assert not outside, f"the helper imports {outside}"
    assert not [m for m in ours if m.startswith("memexporter.serving.job")]
    third = sorted(m for m in others if m not in sys.stdlib_module_names and m != "__future__")
    assert set(third) <= set(THIRD_PARTY), f"the helper imports {third}"
    assert "torch" not in others and "numpy" not in others
