"""``scripts/gpu-check.sh`` on a machine without a GPU: it installs nothing, checks its Python, and stops at
the first step that needs CUDA, saying so (issue 36: GPU machines here have no network, and the old
script pip-installed torch and the dev extras first). Its steps on a GPU: the script's header."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

pytestmark = pytest.mark.integration
SCRIPT = REPO_ROOT / "scripts" / "gpu-check.sh"


def run(python: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": python, "MEMEXPORTER_GPU_CHECK_DIR": str(tmp_path / "gpu-check")}
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_on_cpu_it_stops_before_the_first_cuda_step_and_says_so(tmp_path: Path) -> None:
    out = run(sys.executable, tmp_path)  # the test venv: a CPU build of torch, everything else there
    assert out.returncode == 2, out.stdout + out.stderr
    said = out.stderr.strip().splitlines()
    assert said[-1].startswith("[gpu-check] torch ") and said[-1].endswith(
        "sees no CUDA device: stopping before the first step, which needs CUDA (tests/cuda)"
    )
    summary = (tmp_path / "gpu-check" / "summary.txt").read_text()
    assert "stopped" in summary and "sees no CUDA device" in summary


def test_a_python_without_the_packages_is_one_line_naming_them(tmp_path: Path) -> None:
    venv.create(tmp_path / "bare", with_pip=False)  # a Python with nothing installed
    out = run(str(tmp_path / "bare" / "bin" / "python"), tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert "lacks torch, prometheus-client, psutil, numpy, pyyaml, pytest" in out.stderr
    assert "installs nothing (no network)" in out.stderr


def test_no_python_at_all_says_how_to_name_one(tmp_path: Path) -> None:
    out = run(str(tmp_path / "no-such-python"), tmp_path)
    assert out.returncode == 2 and "set PYTHON to the Python that has your CUDA build of torch" in out.stderr
