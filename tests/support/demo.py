"""``memexporter demo`` (and other ``memexporter`` commands) as a subprocess of a test."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.support import REPO_ROOT
from tests.support.forkserver import Process
from tests.support.process import running_command


def module_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ``python -m memexporter``: this checkout first on ``PYTHONPATH``, no
    inherited ``MEMEXPORTER_*`` knobs (a developer's shell must not change the test), and
    ``MEMEXPORTER_STRICT=1``, so a port taken by another process fails the start at once (with
    the port in the error) instead of training on without an endpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMEXPORTER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["MEMEXPORTER_STRICT"] = "1"
    env.update(extra or {})
    return env


# The demo's model at a tenth of its CPU, for live tests that read the exporter, not the model's size: one
# block of width 64 on 4 sequences of 32 tokens. The default model keeps a demo at half a core at 5 steps/s.
SMALL_MODEL = ("--layers", "1", "--d-model", "64", "--seq-len", "32", "--batch-size", "4")


def demo_args(port: int, *extra_args: str) -> list[str]:
    """``memexporter`` arguments for the CPU demo on ``port``, 5 steps a second."""
    return ["demo", "--device", "cpu", "--port", str(port), "--step-interval", "0.2", *extra_args]


def demo_argv(port: int, *extra_args: str) -> list[str]:
    return [sys.executable, "-m", "memexporter", *demo_args(port, *extra_args)]


def torchrun_demo_argv(base_port: int, *extra_args: str, nproc: int = 2) -> list[str]:
    """``torchrun --standalone --nproc-per-node=N -m memexporter demo ...`` (rank r serves on
    ``base_port + LOCAL_RANK``; the demo joins a gloo process group when WORLD_SIZE > 1)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--module",
        "memexporter",
        *demo_args(base_port, *extra_args),
    ]


@contextlib.contextmanager
def running_demo(
    port: int,
    *extra_args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    log: Path | None = None,
    fresh: bool = False,
) -> Iterator[Process]:
    """Start the CPU demo on ``127.0.0.1:port``; yield once ``/metrics`` answers 200, stop it after.

    Its output goes to ``log`` (a temporary file by default): a test that outlives the demo's
    start can show it when the demo stops unexpectedly. Raises
    ``tests.support.process.ProcessError`` with the demo's output if it exits or is not ready
    within ``timeout`` seconds. ``fresh``: a new interpreter rather than a fork of the worker's zygote
    (``tests/support/forkserver.py``), for the tests of what only a fresh process shows.
    """
    with running_command(
        demo_argv(port, *extra_args),
        [f"http://127.0.0.1:{port}/metrics"],
        env=module_env(env),
        cwd=REPO_ROOT,
        timeout=timeout,
        what="memexporter demo",
        log=log,
        fresh=fresh,
    ) as proc:
        yield proc


@contextlib.contextmanager
def running_torchrun_demo(
    base_port: int, *extra_args: str, nproc: int = 2, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> Iterator[Process]:
    """The demo under torchrun with ``nproc`` CPU ranks; yields once every rank's ``/metrics``
    (``base_port + LOCAL_RANK``) answers; stops torchrun and its workers afterwards."""
    urls = [f"http://127.0.0.1:{base_port + r}/metrics" for r in range(nproc)]
    with running_command(
        torchrun_demo_argv(base_port, *extra_args, nproc=nproc),
        urls,
        env=module_env(env),
        cwd=REPO_ROOT,
        timeout=timeout,
        what="torchrun memexporter demo",
    ) as proc:
        yield proc
