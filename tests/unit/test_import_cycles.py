"""No import cycle in the package, type-only imports included, read from the source.

A cycle that works only because of statement order (``__init__`` -> ``api`` -> ``exporter`` ->
``memexporter.__version__``) breaks on the next reordering, and a type-only one is a layering
mistake the type checker hides. ``from pkg import sub`` is an import of the submodule ``pkg.sub``,
and of ``pkg/__init__``, which Python runs first (but for the root package's: it is the public
face, importing the API, not a layer); ``from pkg import name`` of anything else is an import of
``pkg`` itself.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from tests.support import REPO_ROOT

PACKAGE = REPO_ROOT / "memexporter"


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def graph(names: Mapping[str, Path]) -> dict[str, set[str]]:
    """``{module: the package modules it imports}``, every import statement counted."""
    edges: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names}
        found = {m for m in found if m in names}
        # Importing pkg.sub from outside pkg runs pkg/__init__ first: a sub-package's __init__ is a
        # real dependency (the root's is not counted: it is the public face, importing the API).
        found |= {
            p for m in found for p in _parents(m) if p in names and "." in p and not f"{name}.".startswith(f"{p}.")
        }
        edges[name] = found - {name}
    return edges


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle() -> None:
    edges = graph(module_names())
    found = cycles(edges)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(f"{m} (imports {sorted(edges[m] & set(c))})" for m in c) for c in found
    )


def test_the_spec_table_is_a_leaf() -> None:
    edges = graph(module_names())
    table = sorted(m for m in edges if m == "memexporter.metrics" or m.startswith("memexporter.metrics."))
    assert len(table) > 1 and edges["memexporter.metrics"], "the spec table joins its family modules"
    outside = {m: sorted(e for e in edges[m] if not e.startswith("memexporter.metrics")) for m in table}
    assert not any(outside.values()), f"metrics/ (the spec table) imports nothing of the package outside it: {outside}"


def test_a_type_only_cycle_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n__version__ = '1'\n")
    (pkg / "a.py").write_text("from pkg import b\nclass A: ...\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n")
    (pkg / "sub" / "c.py").write_text("from pkg import __version__\n")  # the package itself, not a submodule
    (pkg / "sub" / "__init__.py").write_text("from pkg.d import D\n")  # a sub-package's face importing back
    (pkg / "d.py").write_text("from pkg.sub.c import C\nclass D: ...\n")
    edges = graph(module_names(pkg))
    assert edges["pkg.sub.c"] == {"pkg"} and edges["pkg.b"] == {"pkg.a"} and edges["pkg.d"] == {"pkg.sub", "pkg.sub.c"}
    assert cycles(edges) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.sub"]]
