"""The minimum torch version: read from metadata without importing torch, checked with a message
that says what to do, and never in the way of the commands that need no torch (those, in a fresh
interpreter without torch: tests/integration/test_without_torch.py)."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from memexporter.backends import torchcheck
from tests.support import REPO_ROOT


@pytest.mark.parametrize(
    ("version", "parsed"),
    [
        ("2.13.0+cpu", (2, 13)),
        ("2.1.0", (2, 1)),
        ("2.6.0a0+ecf3bae40a.nv25.01", (2, 6)),
        ("10.0", (10, 0)),
    ],
)
def test_parse(version: str, parsed: tuple[int, int]) -> None:
    assert torchcheck.parse(version) == parsed


def test_parse_rejects_what_is_not_a_version() -> None:
    with pytest.raises(ValueError, match="'nightly'"):
        torchcheck.parse("nightly")


@pytest.mark.parametrize("version", ["2.8.0", "2.8.0+cu128", "2.11.0", "2.13.0+cpu", "3.0.0"])
def test_supported_versions_pass(version: str) -> None:
    assert torchcheck.require_torch(version) == version


@pytest.mark.parametrize("version", ["2.7.1", "2.1.2+cu121", "1.13.1+cu117", "2.6.0a0+git1234"])
def test_older_torch_fails_naming_both_versions(version: str) -> None:
    with pytest.raises(ImportError, match=rf"needs torch>=2\.8, found torch {re.escape(version)}: install"):
        torchcheck.require_torch(version)


def test_installed_torch_is_read_from_metadata() -> None:
    import torch

    # The wheel's metadata names the release; torch.__version__ may add a local build tag that the
    # metadata lacks: PyPI takes no local versions, so its CUDA wheel of 2.11 says "2.11.0" where
    # torch says "2.11.0+cu130" (the CPU index's wheel says "2.13.0+cpu" in both).
    found = torchcheck.installed_version()
    assert found in (torch.__version__, torch.__version__.split("+")[0])
    assert torchcheck.require_torch() == found


def test_the_oldest_torch_the_test_command_runs_is_the_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    # scripts/torch_versions.py runs the tests on the oldest release the package claims: a minimum
    # raised or lowered without it is a claim no test checks.
    spec = importlib.util.spec_from_file_location("torch_versions", REPO_ROOT / "scripts" / "torch_versions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "torch_versions", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    assert min(torchcheck.parse(v.torch) for v in module.VERSIONS) == torchcheck.MIN_TORCH
