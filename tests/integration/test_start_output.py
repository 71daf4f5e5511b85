"""``start()`` in a script that never set up logging says once, on stderr, where it serves (issue
27: the line was logged at INFO, which such a script never shows, so a new user did not know where
to look); a script that set up logging gets it as a log record instead, not twice."""

from __future__ import annotations

import sys

import pytest

from tests.support import REPO_ROOT, forkserver
from tests.support.demo import module_env
from tests.support.stderr import SERVING

pytestmark = [pytest.mark.integration]

SCRIPT = """
import logging, sys
if sys.argv[1] == "logging":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
import memexporter
e = memexporter.start(port=0, addr="127.0.0.1")
print(e.url, flush=True)
e.stop()
e = memexporter.start(port=0, addr="127.0.0.1")
e.port  # the line comes when the helper has bound: before the port is known
e.stop()  # a second start says it again: each start serves somewhere new
"""


def run(mode: str) -> tuple[str, list[str]]:
    env = {k: v for k, v in module_env().items() if k != "MEMEXPORTER_STRICT"}
    # Forked from the worker's zygote: it imported torch, never logging's configuration (what is read here).
    out = forkserver.run([sys.executable, "-c", SCRIPT, mode], timeout=120, env=env, cwd=REPO_ROOT, scripts=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()[0], out.stderr.splitlines()


def test_without_logging_set_up_start_says_where_on_stderr() -> None:
    url, err = run("plain")
    assert len(err) == 2 and all(SERVING.fullmatch(line) for line in err), err
    assert err[0] == f"memexporter: serving {url} (rank 0)"


def test_with_logging_set_up_it_is_one_log_record_per_start() -> None:
    url, err = run("logging")
    assert err[0] == f"INFO memexporter memexporter: serving {url} (rank 0)"
    assert [line for line in err if "serving" in line and not line.startswith("INFO memexporter ")] == []
    assert sum("serving" in line for line in err) == 2, err
