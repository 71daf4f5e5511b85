"""The release artefacts: ``python -m build`` makes an sdist and a wheel that ``twine check --strict``
passes, with the metadata a release needs, and the wheel alone (no checkout, no torch) renders the
rules and the dashboards exactly as committed."""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import memexporter
from memexporter import rules
from memexporter.cli import export
from tests.support import REPO_ROOT

# One worker builds for the module: two builds at once in the checkout raced on setuptools' staging
# folder (memexporter-0.2.0/) and CI saw "No such file or directory" from the sdist.
pytestmark = [pytest.mark.slow(seconds=30), pytest.mark.integration, pytest.mark.xdist_group("package-build")]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # An isolated build (a fresh environment with the declared build backend), as a release does.
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def _one(dist: Path, pattern: str) -> Path:
    (path,) = dist.glob(pattern)
    return path


def test_twine_check_strict_passes(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2


def test_wheel_metadata_is_releasable(dist: Path) -> None:
    wheel = _one(dist, f"memexporter-{memexporter.__version__}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read(f"memexporter-{memexporter.__version__}.dist-info/METADATA"))
        names = set(z.namelist())
    assert meta["License-Expression"] == "Apache-2.0"
    assert f"memexporter-{memexporter.__version__}.dist-info/licenses/LICENSE" in names
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.10" in classifiers and "Typing :: Typed" in classifiers
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Source", "Issues", "Changelog"} <= set(urls)
    assert meta["Requires-Python"] == ">=3.10"
    # torch is checked at run time, never a dependency: pip would replace a user's CUDA build.
    assert not [r for r in meta.get_all("Requires-Dist") or [] if r.startswith("torch")]
    assert meta.get_payload().startswith("# memexporter")  # the README as the long description
    assert "memexporter/py.typed" in names
    assert "memexporter/serving/live.html" in names  # the live page at / (serving/page.py reads it)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", ".venv/"))]


def test_sdist_carries_what_operators_deploy(dist: Path) -> None:
    sdist = _one(dist, f"memexporter-{memexporter.__version__}.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = {
        "LICENSE",
        "CHANGELOG.md",
        "README.md",
        "Dockerfile",
        "alerts/memexporter.rules.yml",
        "alerts/runbook.md",
        "alertmanager/alertmanager.example.yml",
        "deploy/compose/compose.yaml",
        "deploy/kubernetes/kustomization.yaml",
        "examples/prometheus/podmonitor.yaml",
        "grafana/provisioning/dashboards/memexporter.yml",
        *(f"grafana/dashboards/{n}" for n in export.rendered()),
    }
    assert wanted <= names, sorted(wanted - names)
    assert not [n for n in names if "__pycache__" in n or n.startswith(".venv")]


def test_the_wheel_alone_renders_rules_and_dashboards_without_torch(dist: Path, tmp_path: Path) -> None:
    """Install the wheel into an empty folder and run its commands from there, outside the checkout,
    with torch unimportable: what `memexporter rules` and `dashboards` need is inside the wheel."""
    site = tmp_path / "site"
    wheel = _one(dist, "*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import memexporter; assert memexporter.__file__.startswith(sys.argv[1]), memexporter.__file__\n"
        "from memexporter.cli import main\n"
        "assert main(['rules', '--output', 'rules.yml']) == 0\n"
        "assert main(['rules', '--format', 'prometheusrule', '--output', 'rule.yaml']) == 0\n"
        "assert main(['dashboards', '--output', 'dashboards']) == 0\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", code, str(site)],
        cwd=work,
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (work / "rules.yml").read_text(encoding="utf-8") == rules.render()
    assert "kind: PrometheusRule" in (work / "rule.yaml").read_text(encoding="utf-8")
    written = {p.name: p.read_text(encoding="utf-8") for p in (work / "dashboards").iterdir()}
    assert written == {p.name: p.read_text(encoding="utf-8") for p in (REPO_ROOT / "grafana/dashboards").glob("*.json")}
