"""The fork server (tests/support/forkserver.py, zygote.py): a forked ``python -m memexporter`` is the
process a fresh interpreter would be, for what the tests read of it, at a fraction of the CPU.

Each check would fail on a fork that skipped a step of the zygote's ``become``: the exit status and
both outputs, the input, the folder, the environment (a bad ``MEMEXPORTER_*`` value is the command's
own error), ``sys.argv``, its own session, a signal's status, ``atexit`` on the way out, a demo that
serves ``/metrics``, and the commands it must leave to a real interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support import REPO_ROOT, forkserver
from tests.support.demo import SMALL_MODEL, module_env, running_demo
from tests.support.forkserver import Forked, eligible, popen, run
from tests.support.ports import free_port
from tests.support.web import get_text

pytestmark = pytest.mark.integration

MX = [sys.executable, "-m", "memexporter"]


def test_a_forked_command_has_its_status_outputs_folder_and_environment(tmp_path: Path) -> None:
    done = run([*MX, "rules", "--preset", "nope"], env=module_env(), cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'nope'" in done.stderr and done.stdout == "", done
    bad = run([*MX, "rules"], env=module_env({"MEMEXPORTER_LOG_LEVEL": "loud"}), timeout=60)
    assert bad.returncode != 0 and "MEMEXPORTER_LOG_LEVEL" in bad.stderr, bad
    out = tmp_path / "rules.yml"
    wrote = run([*MX, "rules", "--output", "rules.yml"], env=module_env(), cwd=tmp_path, timeout=60)
    assert wrote.returncode == 0 and "MemexporterOOMImminent" in out.read_text(), wrote


def test_a_forked_command_is_its_own_process_in_its_own_session(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    with log.open("wb") as fh:
        proc = popen(
            [*MX, "demo", "--device", "cpu", "--port", str(free_port()), "--step-interval", "0.2", *SMALL_MODEL],
            env=module_env(),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    assert isinstance(proc, Forked)
    try:
        deadline = time.monotonic() + 60
        while "training" not in log.read_text(errors="replace") and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        me = psutil.Process(proc.pid)
        assert os.getpgid(proc.pid) == proc.pid and os.getsid(proc.pid) == proc.pid
        assert me.ppid() != os.getpid() and me.parent().cmdline()[1:3] == ["-m", "tests.support.zygote"]
        assert me.cmdline()[1:3] == ["-m", "tests.support.zygote"]  # a fork: the zygote's command line
        # torch was loaded before the fork: the zygote, which runs no command itself, maps libtorch. (A bound of
        # 2.5 CPU-s on the child's time said so indirectly, and failed for another cause: in a run whose venv
        # lacked most bytecode (2026-11-28), the demo's own start compiled its imports in 4.4 CPU-s.)
        assert "libtorch_cpu" in Path(f"/proc/{me.ppid()}/maps").read_text()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()


def test_input_argv_and_atexit_reach_the_forked_command(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import atexit, sys\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "print('argv', sys.argv[1:], 'read', sys.stdin.read().strip())\n"
        "sys.exit(3)\n"
    )
    done = run(
        [*MX, "run", "--port", "0", "--no-http", str(script), "a", "b"], env=module_env(), input="hello", timeout=120
    )
    assert done.returncode == 3, done
    assert "argv ['a', 'b'] read hello" in done.stdout and done.stdout.rstrip().endswith("atexit ran"), done


def test_the_forked_demo_serves_its_metrics() -> None:
    port = free_port()
    with running_demo(port, *SMALL_MODEL) as proc:
        assert isinstance(proc, Forked)
        assert "memexporter_steps_total" in get_text(f"http://127.0.0.1:{port}/metrics")


@pytest.mark.parametrize(
    ("argv", "env", "scripts", "forks"),
    [
        ([*MX, "demo"], {}, False, True),
        ([sys.executable, "-m", "tests.support.rank_exposition"], {}, False, False),
        ([sys.executable, "-m", "tests.support.rank_exposition"], {}, True, True),
        ([sys.executable, "-m", "torch.utils.collect_env"], {}, True, False),
        ([sys.executable, "-m", "torch.distributed.run", "-m", "memexporter"], {}, False, False),
        ([sys.executable, "-c", "import torch"], {}, False, False),
        ([sys.executable, "-c", "import torch"], {}, True, True),
        ([sys.executable, "job.py", "1"], {}, True, True),
        ([sys.executable, "-u", "job.py"], {}, True, False),
        (["memexporter", "demo"], {}, True, False),
        ([*MX, "demo"], {"PYTHONPATH": f"{REPO_ROOT}{os.pathsep}/somewhere/else"}, False, False),  # a stand-in there
        ([*MX, "demo"], {"PYTHONWARNINGS": "error"}, False, False),  # read when the interpreter starts
        ([*MX, "demo"], {"LD_PRELOAD": "libfoo.so"}, False, False),
        ([*MX, "demo"], {"TORCH_LOGS": "dynamo"}, False, False),
        ([*MX, "demo"], {"MEMEXPORTER_PORT": "9500", "OMP_NUM_THREADS": "2"}, False, True),  # read after the start
    ],
    ids=[
        "demo",
        "support-module",
        "support-module-asked",
        "other-module",
        "torchrun",
        "code",
        "code-asked",
        "script-asked",
        "flags",
        "console-script",
        "pythonpath",
        "warnings",
        "preload",
        "torch-env",
        "knobs",
    ],
)
def test_what_forks_and_what_runs_fresh(argv: list[str], env: dict[str, str], scripts: bool, forks: bool) -> None:
    assert eligible(argv, module_env(env), scripts) is forks


def test_a_forked_script_and_code_run_as_main(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint(__name__, sys.argv, sys.path[0])\nsys.exit(int(sys.argv[1]))\n")
    done = run([sys.executable, str(script), "4"], env=module_env(), scripts=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (4, f"__main__ {[str(script), '4']} {tmp_path}"), done
    code = "import sys; print(__name__, sys.argv, repr(sys.path[0])); raise SystemExit(5)"
    done = run([sys.executable, "-c", code, "x"], env=module_env(), scripts=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (5, "__main__ ['-c', 'x'] ''"), done


ECHO = """
import sys
print("ready", flush=True)
line = sys.stdin.readline()
print("got", line.strip(), flush=True)
print("more", sys.stdin.read().strip())
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


@pytest.mark.parametrize("text", [True, False])
def test_a_forked_command_talks_through_pipes_as_popen_does(text: bool) -> None:
    # subprocess.PIPE for all three: a readline() first, then communicate(), which keeps what that read ahead.
    proc = popen(
        [sys.executable, "-c", ECHO],
        env=module_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        scripts=True,
        text=text,
    )
    assert isinstance(proc, Forked) and proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline() == ("ready\n" if text else b"ready\n")
    proc.stdin.write("one\n" if text else b"one\n")
    proc.stdin.flush()
    out, err = proc.communicate("two" if text else b"two", timeout=60)
    assert (proc.returncode, out, err) == (
        (3, "got one\nmore two\n", "to stderr\n") if text else (3, b"got one\nmore two\n", b"to stderr\n")
    )


def test_communicate_times_out_as_popen_does_and_goes_on_after() -> None:
    code = "import time; time.sleep(2); print('late')"
    proc = popen([sys.executable, "-c", code], env=module_env(), stdout=subprocess.PIPE, scripts=True)
    assert isinstance(proc, Forked)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.3)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, b"late\n", None)


def test_fresh_and_the_switch_run_a_real_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [*MX, "rules", "--help"]
    real = popen(argv, env=module_env(), stdout=subprocess.DEVNULL, fresh=True)
    assert isinstance(real, subprocess.Popen) and real.wait(60) == 0
    monkeypatch.setenv("MEMEXPORTER_TEST_FORK", "0")
    assert not eligible(argv, module_env())


def test_the_zygote_is_no_child_of_the_worker_and_a_killed_one_is_replaced() -> None:
    argv = [*MX, "rules", "--help"]
    assert run(argv, env=module_env(), timeout=60).returncode == 0
    first = forkserver._server.pid
    assert first is not None and first not in [p.pid for p in psutil.Process().children(recursive=True)]
    os.kill(first, signal.SIGKILL)
    assert run(argv, env=module_env(), timeout=60).returncode == 0  # a new server answers
    assert forkserver._server.pid not in (None, first)
