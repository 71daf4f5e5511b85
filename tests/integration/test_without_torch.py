"""Without torch, in a fresh interpreter where ``import torch`` fails: ``import memexporter`` and the
rules and dashboards commands still work, and ``start()`` and ``memexporter demo`` say what to do
in one line (the version check itself: tests/unit/backends/test_torchcheck.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import REPO_ROOT

pytestmark = pytest.mark.integration


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
    assert "memexporter needs torch>=2.8, and torch is not installed: install" in result.stdout
    result = _run(hide + "from memexporter.cli import main; raise SystemExit(main(['demo']))")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("memexporter needs torch>=2.8, and torch is not installed")
    assert "Traceback" not in result.stderr
