"""The layering DESIGN.md fixes, read from the source: one module each touches torch.cuda, torch.xpu,
MPS's memory (through torch.accelerator), pynvml and amdsmi, the backend protocols sit in a leaf module, and the training-thread side (tracking/)
never imports the scrape side, so the layers point one way:
backends -> tracking -> scrape -> collectors."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

PACKAGE = REPO_ROOT / "memexporter"


def imports(path: Path, runtime_only: bool = False) -> set[str]:
    """Modules ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    if runtime_only:  # imports under `if TYPE_CHECKING:` do not run
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip |= {id(n) for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize(
    ("target", "owner"),
    [
        ("torch.cuda", "backends/cuda.py"),
        ("pynvml", "backends/nvml.py"),
        ("torch.xpu", "backends/xpu.py"),
        ("amdsmi", "backends/amdsmi.py"),
    ],
)
def test_one_module_touches_each_device_library(target: str, owner: str) -> None:
    users = {
        str(p.relative_to(PACKAGE))
        for p in modules()
        if any(m == target or m.startswith(f"{target}.") for m in imports(p))
    }
    assert users == {owner}


@pytest.mark.parametrize(
    ("pattern", "owner"),
    [
        (r"\btorch\.xpu\.", "backends/xpu.py"),
        (r"\btorch\.mps\.", None),  # every torch.mps memory call creates the Metal device: none is made
        (r"\btorch\.accelerator\.(memory_stats|get_memory_info|memory_allocated)", "backends/mps.py"),
    ],
)
def test_device_memory_calls_stay_in_their_backend(pattern: str, owner: str | None) -> None:
    # torch.xpu and torch.accelerator come with ``import torch``: the imports alone do not tell, the
    # attribute chains in the code do (docstrings and help texts may name them).
    def uses(path: Path) -> bool:
        chains = (ast.unparse(n) for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute))
        return any(re.match(pattern, chain + ".") for chain in chains)

    users = {str(p.relative_to(PACKAGE)) for p in modules() if uses(p)}
    assert users == ({owner} if owner else set())


def test_no_module_imports_deepspeed() -> None:
    """DeepSpeed's storage rules read the marks it puts on tensors and optimizers
    (tracking/storage/deepspeed.py, zero.py): importing memexporter never imports DeepSpeed."""
    users = {str(p.relative_to(PACKAGE)) for p in modules() if any(m.split(".")[0] == "deepspeed" for m in imports(p))}
    assert not users


def test_backend_protocols_live_in_a_leaf_module() -> None:
    assert not {m for m in imports(PACKAGE / "backends" / "base.py", runtime_only=True) if m.startswith("memexporter")}


def test_tracking_never_imports_the_scrape_side() -> None:
    for path in sorted((PACKAGE / "tracking").glob("*.py")):
        bad = {
            m
            for m in imports(path)
            if m.startswith(
                ("memexporter.collectors.scrape", "memexporter.collectors", "memexporter.collectors.registry")
            )
        }
        assert not bad, f"{path.name} imports {bad}"


def test_the_top_of_the_package_holds_only_the_api_and_the_leaves() -> None:
    # Everything else has its sub-package (docs/development.md: the layout); the healthcheck stays
    # as a shim because the image and the compose stack run `python -m memexporter.healthcheck`.
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", "_version", "api", "exporter", "healthcheck", "units"}
    assert (PACKAGE / "metrics" / "__init__.py").is_file(), "the spec table is a leaf package, one file per family"
    shim = (PACKAGE / "healthcheck.py").read_text()
    assert "from memexporter.cli.healthcheck import main" in shim and len(shim.splitlines()) <= 6
