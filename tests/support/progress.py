"""Progress for the long tests, so a run of the whole suite is never silent for minutes.

- Every test marked ``@pytest.mark.slow`` names itself as it starts: ``[slow] started NAME``;
  of a parametrized one, only the first case a process runs (its module fixture, paid once, is
  usually the slow part). Under pytest-xdist the worker running it writes the line straight to
  the terminal (workers share the controller's stderr; pytest's capture is off between tests), so
  it appears when the test starts, not when it ends.
- Each slow test that took ``QUIET_S`` or more, or failed, gets a line with its outcome and
  duration (setup to teardown). ~100 "passed in 0.0s" lines once buried the ones that matter.
- Under xdist, the controller also prints which tests are still running once a minute, whatever
  their marks: the line that says the suite is alive while only a long live test is left.

Registered by ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

HEARTBEAT_S = 60.0  # how often the controller lists the tests still running
LONG_S = 30.0  # a test running longer than this is listed
QUIET_S = 3.0  # a slow-marked test that ends sooner gets no line


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


class Progress:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker = os.environ.get("PYTEST_XDIST_WORKER")
        self.slow: set[str] = set()  # node ids marked slow, known where the tests were collected
        self.started: dict[str, float] = {}  # node id -> start, for the tests running now
        self.spent: dict[str, float] = {}  # node id -> seconds in its phases so far
        self.outcome: dict[str, str] = {}  # node id -> "failed"/"skipped" once a phase says so
        self.lock = threading.Lock()
        self.announced: set[str] = set()  # slow test functions (ids without parameters) named so far
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def _terminal(self) -> pytest.TerminalReporter | None:
        return self.config.pluginmanager.get_plugin("terminalreporter")  # type: ignore[no-any-return]

    def _say(self, text: str) -> None:
        if self.worker is not None:
            # A worker's terminal reporter goes nowhere; its stderr is the controller's terminal.
            os.write(2, f"\n[slow] {text} ({self.worker})\n".encode())
        elif (tr := self._terminal()) is not None:
            self._line(tr, f"[slow] {text}")

    @staticmethod
    def _line(tr: pytest.TerminalReporter, text: str) -> None:
        # write_line() starts a new line only after a file's name; -q and xdist's dots have none.
        if getattr(getattr(tr, "_tw", None), "width_of_current_line", 0):
            tr.write("\n")
        tr.write_line(text)

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.slow = {item.nodeid for item in items if item.get_closest_marker("slow") is not None}

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        with self.lock:
            self.started[nodeid] = time.monotonic()
        function = nodeid.split("[", 1)[0]
        if nodeid in self.slow and function not in self.announced:
            self.announced.add(function)
            self._say(f"started {nodeid}")

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        with self.lock:
            self.spent[report.nodeid] = self.spent.get(report.nodeid, 0.0) + report.duration
            if report.failed:
                self.outcome[report.nodeid] = "failed"
            elif report.skipped:
                self.outcome.setdefault(report.nodeid, "skipped")
            if report.when != "teardown":
                return
            self.started.pop(report.nodeid, None)
            spent, outcome = self.spent.pop(report.nodeid, 0.0), self.outcome.pop(report.nodeid, "passed")
        # The controller (or the only process) reports the slow tests that finished.
        if (
            self.worker is None
            and "slow" in report.keywords
            and (spent >= QUIET_S or outcome == "failed")
            and (tr := self._terminal()) is not None
        ):
            node = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
            self._line(tr, f"[slow] {outcome} {report.nodeid} in {_clock(spent)}" + (f" ({node})" if node else ""))

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            now = time.monotonic()
            with self.lock:
                long = sorted(((now - t, n) for n, t in self.started.items() if now - t >= LONG_S), reverse=True)
            if long and (tr := self._terminal()) is not None:
                running = ", ".join(f"{n} ({_clock(s)})" for s, n in long[:4])
                self._line(tr, f"[progress] {_clock(now - self.t0)} in; still running: {running}")

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # Only the xdist controller beats: it runs no test, so nothing it writes is captured.
        if self.worker is None and getattr(self.config.option, "numprocesses", None):
            threading.Thread(target=self._beat, name="test-progress", daemon=True).start()

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        self.stop.set()
