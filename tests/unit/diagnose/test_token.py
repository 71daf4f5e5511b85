"""The debug token (``diagnose/token.py``): where its file goes, who may read it, how it is found
again and compared. Every file lives under ``tmp_path`` (``XDG_RUNTIME_DIR``, ``HOME``)."""

from __future__ import annotations

import os
import secrets
import socket
import stat
from pathlib import Path

import pytest

from memexporter.diagnose.token import DebugToken, find, read, runtime_dirs


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "run").mkdir()
    return tmp_path


def test_published_in_a_private_folder_named_by_host_pid_and_port(home: Path) -> None:
    token = DebugToken.create(environ={})
    path = token.publish(9471)
    assert path == home / "run" / "memexporter" / f"memexporter-{socket.gethostname()}-{os.getpid()}-9471.token"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read(path) == token.value and len(token.value) >= 40
    assert find(9471) == [path] and find(9472) == []
    token.publish(9480)  # the real port, once bound: the file follows
    assert not path.exists() and find(9480) == [token.path]
    token.withdraw()
    assert list(path.parent.iterdir()) == [] and token.path is None


def test_a_random_token_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # One token_urlsafe in 64 does, and `memexporter inspect --token TOKEN` read it as an option: a
    # fresh-clone run of the suite failed so (test_inspect_cli's token test, 2026-11-28).
    drawn = iter(["-" + "a" * 42, "_" + "b" * 42])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda nbytes: next(drawn))
    assert DebugToken.create(environ={}).value == "_" + "b" * 42
    given = "-" + "c" * 20  # a user's own token is theirs: --token=TOKEN or the variable pass it
    assert DebugToken.create(environ={"MEMEXPORTER_DEBUG_TOKEN": given}).value == given


def test_without_xdg_runtime_dir_it_goes_under_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert runtime_dirs() == [home / "home" / ".local" / "share" / "memexporter" / "runtime"]
    token = DebugToken.create(environ={})
    assert token.publish(9400) is not None and find(9400) == [token.path]
    token.withdraw()


def test_inspect_looks_in_both_places(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    token = DebugToken.create(environ={})
    token.publish(9400)  # a batch job without XDG_RUNTIME_DIR
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home / "run"))  # an ssh session with it
    assert find(9400) == [token.path]
    token.withdraw()


def test_a_group_readable_folder_is_closed_and_a_symlink_refused(home: Path) -> None:
    folder = home / "run" / "memexporter"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    token = DebugToken.create(environ={})
    assert token.publish(9400) is not None and stat.S_IMODE(folder.stat().st_mode) == 0o700
    token.withdraw()
    folder.rmdir()
    (home / "elsewhere").mkdir()
    folder.symlink_to(home / "elsewhere")
    assert token.publish(9400) is None and list((home / "elsewhere").iterdir()) == []


def test_files_of_dead_processes_are_skipped(home: Path, dead_pid: int) -> None:
    folder = home / "run" / "memexporter"
    folder.mkdir(mode=0o700)
    stale = folder / f"memexporter-{socket.gethostname()}-{dead_pid}-9400.token"
    stale.write_text("x" * 43)
    other_host = folder / f"memexporter-not-{socket.gethostname()}-{os.getpid()}-9400.token"
    other_host.write_text("y" * 43)
    assert find(9400) == []
    token = DebugToken.create(environ={})
    token.publish(9401)  # the next job on this host removes the dead one's file, not another host's
    assert not stale.exists() and other_host.exists()
    token.withdraw()


def test_compared_in_full_and_never_shown() -> None:
    token = DebugToken("0123456789abcdef0123")
    assert token.accepts("0123456789abcdef0123")
    for wrong in (None, "", "0123456789abcdef012", "0123456789abcdef01234", "é" * 20):
        assert not token.accepts(wrong)
    assert "0123456789abcdef0123" not in repr(token)


def test_from_the_environment_at_least_16_characters() -> None:
    assert (
        DebugToken.create(environ={"MEMEXPORTER_DEBUG_TOKEN": "a-shared-secret-value"}).value == "a-shared-secret-value"
    )
    for bad in ("too-short", "has a space in it, long enough"):
        with pytest.raises(ValueError, match="MEMEXPORTER_DEBUG_TOKEN must be") as err:
            DebugToken.create(environ={"MEMEXPORTER_DEBUG_TOKEN": bad})
        assert bad not in str(err.value)


def test_a_forked_child_leaves_the_parents_file(home: Path) -> None:
    token = DebugToken.create(environ={})
    path = token.publish(9400)
    assert path is not None
    pid = os.fork()
    if pid == 0:  # the child: exit as a DataLoader worker might, through withdraw()
        token.withdraw()
        os._exit(0)
    os.waitpid(pid, 0)
    assert path.exists()
    token.withdraw()
    assert not path.exists()
