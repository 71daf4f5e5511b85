"""`memexporter run` and the environment bootstrap start the exporter around an unmodified script."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memexporter.bootstrap import path as bootstrap_path
from tests.support import REPO_ROOT, forkserver
from tests.support.demo import module_env
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

# An unmodified training script: it knows nothing about memexporter. It checks, from the inside,
# that an exporter serves its steps, and exits with the code the test expects.
SCRIPT = textwrap.dedent(
    """
    import sys, time, urllib.request
    import torch
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    port = int(sys.argv[1])
    for _ in range(50):  # the snapshots are a second apart
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        if 'memexporter_steps_total{rank="0"} 3.0' in body:
            break
        time.sleep(0.1)
    assert 'memexporter_steps_total{rank="0"} 3.0' in body, body[:300]
    print("script-args", sys.argv[1:], "name", __name__)
    sys.exit(int(sys.argv[2]))
    """
)


def run(args: list[str], env: dict[str, str] | None = None, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """``python -m memexporter run`` forked from the worker's zygote (it runs the script in its own
    process); the bootstrap's runs, a console script and torchrun in real interpreters (``eligible``)."""
    return forkserver.run(args, timeout=120, env=module_env(env), cwd=cwd)


def test_run_script_with_options_and_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = free_port()
    out = run(
        [
            sys.executable,
            "-m",
            "memexporter",
            "run",
            "--port",
            str(port),
            "--addr",
            "127.0.0.1",
            str(script),
            str(port),
            "7",
        ]
    )
    assert out.returncode == 7, out.stdout + out.stderr
    assert f"script-args ['{port}', '7'] name __main__" in out.stdout
    # memexporter's own logger says where the metrics are (INFO: needs the handler `run` sets up)
    assert f"memexporter INFO memexporter: serving http://127.0.0.1:{port}/metrics" in out.stderr, out.stderr


def _entry_point() -> str:
    import shutil

    found = shutil.which("memexporter", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"needs the memexporter command beside {sys.executable} (pip install -e .)")
    return found


def test_run_module_from_the_console_script(tmp_path: Path) -> None:
    # As a user types it, from the folder that holds the package: sys.path[0] must be that folder.
    pkg = tmp_path / "mytrain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text(SCRIPT)
    port = free_port()
    out = run([_entry_point(), "run", "--port", str(port), "-m", "mytrain.main", str(port), "0"], cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_run_leaves_the_scripts_logging_and_exit_message_alone(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
        import logging, sys
        logging.basicConfig(level=logging.DEBUG, format="USER %(message)s")
        logging.getLogger("train").debug("debug line")
        sys.exit("fatal: out of patience")
        """
        )
    )
    # python -m: the console script's own start is test_run_module_from_the_console_script's
    out = run([sys.executable, "-m", "memexporter", "run", "--port", "0", "--addr", "127.0.0.1", str(script)])
    assert out.returncode == 1
    assert "USER debug line" in out.stderr, "the script's own basicConfig took effect"
    assert "fatal: out of patience" in out.stderr


def test_run_rejects_a_bad_option_value(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('should not run')")
    out = run([sys.executable, "-m", "memexporter", "run", "--port", "abc", str(script)])
    assert out.returncode == 2
    assert "'abc'" in out.stderr and "should not run" not in out.stdout


def test_environment_bootstrap_starts_the_exporter(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = free_port()
    env = {
        "MEMEXPORTER_AUTOSTART": "1",
        "MEMEXPORTER_PORT": str(port),
        "MEMEXPORTER_ADDR": "127.0.0.1",
        "PYTHONPATH": f"{bootstrap_path()}:{REPO_ROOT}",
    }
    out = run([sys.executable, str(script), str(port), "0"], env=env)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow(seconds=35)
def test_the_bootstrap_finds_the_model_and_exports_its_rows(tmp_path: Path) -> None:
    # auto_track is on under the bootstrap: no code names the model, its row appears all the same.
    script = tmp_path / "train.py"
    script.write_text(
        SCRIPT.replace("range(3)", "range(4)").replace(
            '{rank="0"} 3.0',
            '{rank="0"} 4.0\' in body and \'memexporter_module_parameter_bytes{module="(root)",rank="0"} 288.0',
        )
    )
    port = free_port()
    env = {
        "MEMEXPORTER_AUTOSTART": "1",
        "MEMEXPORTER_PORT": str(port),
        "MEMEXPORTER_ADDR": "127.0.0.1",
        "PYTHONPATH": f"{bootstrap_path()}:{REPO_ROOT}",
    }
    out = run([sys.executable, str(script), str(port), "0"], env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    out = run([sys.executable, str(script), str(port), "0"], env={**env, "MEMEXPORTER_AUTO_TRACK": "0"})
    assert out.returncode == 1 and "memexporter_module_parameter_bytes" not in out.stdout, out.stderr[-500:]


def test_bootstrap_skips_torchrun_launcher_and_reports_bad_values(tmp_path: Path) -> None:
    from memexporter.bootstrap import sitecustomize

    assert not sitecustomize._should_start(["python"])  # MEMEXPORTER_AUTOSTART unset in this process
    script = tmp_path / "noop.py"
    script.write_text("print('ran')")
    env = {
        "MEMEXPORTER_AUTOSTART": "1",
        "MEMEXPORTER_PORT": "not-a-port",
        "PYTHONPATH": f"{bootstrap_path()}:{REPO_ROOT}",
    }
    out = run([sys.executable, str(script)], env=env)
    assert out.returncode == 0 and "ran" in out.stdout  # the interpreter still starts
    assert "memexporter bootstrap: not started" in out.stderr and "MEMEXPORTER_PORT" in out.stderr


def test_bootstrap_says_a_mistyped_autostart_and_an_unknown_variable(tmp_path: Path) -> None:
    script = tmp_path / "noop.py"
    script.write_text("print('ran')")
    env = {"MEMEXPORTER_AUTOSTART": "yes please", "PYTHONPATH": f"{bootstrap_path()}:{REPO_ROOT}"}
    out = run([sys.executable, str(script)], env=env)
    assert out.returncode == 0 and "ran" in out.stdout
    assert "memexporter bootstrap: not started: MEMEXPORTER_AUTOSTART='yes please' is not a boolean" in out.stderr
    # Started, with a typo beside it: said once on stderr (no logging is set up at interpreter start).
    port = free_port()
    env = {
        "MEMEXPORTER_AUTOSTART": "1",
        "MEMEXPORTER_PORT": str(port),
        "MEMEXPORTER_ADDR": "127.0.0.1",
        "MEMEXPORTER_PROT": "9500",
        "PYTHONPATH": f"{bootstrap_path()}:{REPO_ROOT}",
    }
    out = run([sys.executable, str(script)], env=env)
    assert out.returncode == 0 and "ran" in out.stdout, out.stderr
    assert out.stderr.count("MEMEXPORTER_PROT; did you mean MEMEXPORTER_PORT?") == 1, out.stderr


def test_bootstrap_chains_to_the_next_sitecustomize(tmp_path: Path) -> None:
    # A distribution's or a site's own sitecustomize, later on sys.path, must still run.
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("print('the other sitecustomize ran')\n")
    env = {"PYTHONPATH": f"{bootstrap_path()}:{other}:{REPO_ROOT}"}
    out = run([sys.executable, "-c", "print('the program ran')"], env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["the other sitecustomize ran", "the program ran"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py"], True),
        (["python", "/venv/bin/torchrun", "--nproc_per_node=2", "train.py"], False),
        (["python", "-m", "torch.distributed.run", "train.py"], False),
        (
            ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()", "--multiprocessing-fork"],
            False,
        ),
        (["python", "-c", "from multiprocessing.forkserver import main; main(3, 4)"], False),
        (["python", "/venv/bin/accelerate", "launch", "train.py"], False),
        (["python", "-m", "deepspeed.launcher.runner", "train.py"], False),
        (["python", "-u", "train.py"], True),
        (["python", "-m", "pkg.train"], True),
        (["python"], False),
        (["python", "/venv/bin/memexporter", "rules"], False),
        (["python", "-m", "pip", "install", "x"], False),
    ],
)
def test_bootstrap_start_decision(argv: list[str], expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from memexporter.bootstrap import sitecustomize

    monkeypatch.setenv("MEMEXPORTER_AUTOSTART", "1")
    assert sitecustomize._should_start(argv) is expected


@pytest.mark.slow
def test_torchrun_no_python_memexporter_run(tmp_path: Path) -> None:
    """`torchrun --no-python memexporter run train.py`: each of two ranks serves port + LOCAL_RANK."""
    import shutil

    from tests.support.ports import free_port_block

    bindir = Path(sys.executable).parent
    memexporter_bin, torchrun = (
        shutil.which("memexporter", path=str(bindir)),
        shutil.which("torchrun", path=str(bindir)),
    )
    if memexporter_bin is None or torchrun is None:
        pytest.skip(f"needs the memexporter and torchrun commands beside {sys.executable} (pip install -e .)")
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
        import os, time, urllib.request
        import torch
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
        port = int(os.environ["BASE_PORT"]) + int(os.environ["LOCAL_RANK"])
        rank = os.environ["RANK"]
        for _ in range(50):  # the snapshots are a second apart
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            if f'memexporter_steps_total{{rank="{rank}"}} 2.0' in body:
                break
            time.sleep(0.1)
        assert f'memexporter_steps_total{{rank="{rank}"}} 2.0' in body, body[:300]
        assert 'world_size="2"' in body
        print("rank", rank, "ok on", port, flush=True)
        """
        )
    )
    base = free_port_block(2)
    out = run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node=2",
            "--no-python",
            memexporter_bin,
            "run",
            "--port",
            str(base),
            "--addr",
            "127.0.0.1",
            str(script),
        ],
        env={"BASE_PORT": str(base)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count(" ok on ") == 2
