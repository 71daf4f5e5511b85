"""The minimum torch version: read from metadata without importing torch, checked with a message
that says what to do, and never in the way of the commands that need no torch."""

from __future__ import annotations

import re
import subprocess
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


@pytest.mark.parametrize("version", ["2.1.0", "2.1.0+cu121", "2.13.0+cpu", "3.0.0"])
def test_supported_versions_pass(version: str) -> None:
    assert torchcheck.require_torch(version) == version


@pytest.mark.parametrize("version", ["2.0.1", "1.13.1+cu117", "2.0.0a0+git1234"])
def test_older_torch_fails_naming_both_versions(version: str) -> None:
    with pytest.raises(ImportError, match=rf"needs torch>=2\.1, found torch {re.escape(version)}: install"):
        torchcheck.require_torch(version)


def test_installed_torch_is_read_from_metadata() -> None:
    import torch

    assert torchcheck.installed_version() == torch.__version__
    assert torchcheck.require_torch() == torch.__version__


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=False
    )


def test_import_and_rules_need_no_torch() -> None:
    """With torch unimportable (``sys.modules["torch"] = None``), ``import memexporter`` and the rules
    and dashboards commands still work, and nothing of memexporter's imported torch."""
    result = _run(
        "import sys; sys.modules['torch'] = None\n"
        "import memexporter, memexporter.backends.torchcheck, memexporter.healthcheck\n"
        "from memexporter.cli import main\n"
        "assert main(['rules', '--format', 'prometheusrule', '--output', '/dev/null']) == 0\n"
        "assert main(['dashboards', '--format', 'configmap', '--output', '/dev/null']) == 0\n"
    )
    assert result.returncode == 0, result.stderr


def test_start_without_torch_says_what_to_do() -> None:
    """``start()`` (and ``memexporter demo``) with torch missing: one clear message, no traceback."""
    hide = (
        "import sys, importlib.metadata as m; sys.modules['torch'] = None\n"
        "real = m.version\n"
        "def version(name):\n"
        "    if name == 'torch': raise m.PackageNotFoundError(name)\n"
        "    return real(name)\n"
        "m.version = version\n"
        "import importlib.util; spec = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'torch' else spec(n, *a)\n"
    )
    result = _run(
        hide + "import memexporter\ntry:\n    memexporter.start(port=0)\n"
        "except ImportError as e:\n    print(e)\nelse:\n    raise SystemExit('started without torch')\n"
    )
    assert result.returncode == 0, result.stderr
    assert "memexporter needs torch>=2.1, and torch is not installed: install" in result.stdout
    result = _run(hide + "from memexporter.cli import main; raise SystemExit(main(['demo']))")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("memexporter needs torch>=2.1, and torch is not installed")
    assert "Traceback" not in result.stderr
