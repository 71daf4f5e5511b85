"""Which ``sys.executable`` may run the helper (serving/job/spawn.py ``check_interpreter``): a Python's name, never
a frozen application or an embedding program, which would run a second copy of the job."""

from __future__ import annotations

import sys

import pytest

from memexporter.serving.job.spawn import Unrunnable, check_interpreter


@pytest.mark.parametrize(
    "executable", ["/usr/bin/python3", "/opt/venv/bin/python", "/usr/bin/python3.12-dbg", "C:\\Py\\python.exe", "pypy3"]
)
def test_a_python_may_run_it(executable: str) -> None:
    check_interpreter(executable)


@pytest.mark.parametrize(
    ("executable", "said"),
    [
        ("/opt/app/trainer", "not a Python interpreter"),
        ("/usr/bin/uwsgi", "not a Python interpreter"),
        ("", "empty"),
    ],
)
def test_anything_else_is_refused_with_why(executable: str, said: str) -> None:
    with pytest.raises(Unrunnable, match=said):
        check_interpreter(executable)


def test_a_frozen_application_is_refused_whatever_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    with pytest.raises(Unrunnable, match="frozen application"):
        check_interpreter("/usr/bin/python3")
