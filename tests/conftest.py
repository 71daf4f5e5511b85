"""Suite-wide set-up: the shared fixtures (``tests/support/fixtures.py``), progress lines for the
slow tests (``tests/support/progress.py``), the longest tests first under xdist
(``tests/support/schedule.py``), and one compute thread per process when the tests run in parallel."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.progress import Progress

pytest_plugins = ["tests.support.fixtures", "tests.support.schedule", "tests.support.budget"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Several workers, each starting demos and torchrun children, on a machine with few cores:
    # with OpenMP's default of one thread per core every process spins on every core, and a
    # demo that should step 5 times a second crawls. One thread each (before torch is imported
    # here, and inherited by every child) keeps them from fighting. A user's setting wins.
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

# The Go binaries the tests start (promtool, Prometheus, Alertmanager, VictoriaMetrics, vmalert) collect
# garbage a quarter as often: promtool's unit tests of the rules, the suite's largest single process, took
# 24 CPU-s instead of 29 (2026-11-28), its RSS 127 MiB at most instead of 70. A user's setting wins.
os.environ.setdefault("GOGC", "400")


# Started as a background job of a non-interactive shell (`cmd &` in a CI script), the whole suite
# would inherit SIGINT ignored, and so would every process it starts: the tests that press Ctrl-C
# on a command (`memexporter sweep`, the demo) would wait for nothing. Take the default back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    # Under --dist loadgroup (scripts/test.sh) the controller sends each xdist_group to one worker: the
    # live chains, torchrun and the package build are module fixtures their group shares. pytest 9.2
    # keeps node ids where pytest-xdist 3.8 tags a group (pytest-dev/pytest-xdist#1386): every group
    # then spreads over every worker, each starting its own chain (a third more CPU, and four
    # VictoriaMetrics chains at once on 2 cores), and nothing says so. Say so, before any test runs.
    pytest_minor = tuple(int(part) for part in pytest.__version__.split(".")[:2])
    if getattr(config.option, "dist", None) == "loadgroup" and pytest_minor >= (9, 2):
        raise pytest.UsageError(
            f"--dist loadgroup does not group tests with pytest {pytest.__version__} (pytest-dev/pytest-xdist#1386): "
            "install the dev extra's pytest (pip install -e '.[dev]': pytest<9.2), or run with -p no:xdist"
        )
    config.pluginmanager.register(Progress(config), "memexporter-progress")
