"""Every shell block of the README and the docs (the ```bash and ```sh fences) runs here, as written
but for the adjustments below, and prints what the text says it prints.

``PLAN`` is the one place that says what a test changes in a command and why: a free port instead
of 9400, a few steps instead of a run until Ctrl-C, a temporary folder instead of ``/etc`` or a
checkout file, a local OTLP receiver instead of ``otel-collector:4318``. ``ADJUST`` applies to every
block: ``pip install`` of memexporter itself is not run (this checkout is the package; the extras
named are checked against the package's metadata instead), ``sudo`` is dropped and ``/etc`` and
``/var/lib`` move under a temporary root. A block that needs what a CI machine lacks (a container
engine, a cluster) names the test that checks what it does. A block missing from ``PLAN``, or an
entry whose block is gone, fails: a new command in the docs says how it is tested.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.support import REPO_ROOT
from tests.support.demo import module_env
from tests.support.ports import free_port
from tests.support.process import stop, tail

pytestmark = pytest.mark.integration

PAGES = (
    "README.md",
    *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md")),
    "alerts/runbook.md",
)
FENCE = re.compile(r"^```(bash|sh)\n(.*?)^```", re.S | re.M)
PIP_SELF = re.compile(r"""^pip install ["']?memexporter(?:\[([\w,-]+)\])?["']?(?=\s|$)""", re.M)


def blocks() -> dict[tuple[str, str], str]:
    """``{(page, first line): block}`` for every shell block of the docs."""
    found: dict[tuple[str, str], str] = {}
    for page in PAGES:
        for m in FENCE.finditer((REPO_ROOT / page).read_text(encoding="utf-8")):
            found[(page, m.group(2).splitlines()[0])] = m.group(2)
    return found


@dataclass(frozen=True)
class Run:
    """Run the block in bash (``-euo pipefail``), the venv's commands first on ``PATH``.

    ``edits``: (as written, as run) pairs; ``{port}``, ``{tmp}``, ``{root}`` and ``{otlp}`` are filled in.
    ``expect``: patterns the output must match (what the text says it prints). ``check``: more
    checks on the temporary folder and the output."""

    why: str
    edits: tuple[tuple[str, str], ...] = ()
    setup: str = ""
    expect: tuple[str, ...] = ()
    cwd: str = "repo"  # or "tmp"
    env: dict[str, str] = field(default_factory=dict)
    otlp: bool = False  # a local OTLP/HTTP receiver at {otlp}
    check: Callable[[Path, str], None] | None = None
    timeout: float = 240


@dataclass(frozen=True)
class Elsewhere:
    """Not run here: ``why``, and the test that checks what the block does."""

    why: str
    test: str


def readme_demo_line(tmp: Path, out: str) -> None:
    said = re.search(r"```\n(memexporter demo: training .*?)\n```", (REPO_ROOT / "README.md").read_text()).group(1)  # type: ignore[union-attr]
    port = re.search(r"open http://localhost:(\d+)/", out)
    assert port and said.replace("9400", port.group(1)) in out, (
        f"the README says the demo prints\n{said}\nit printed\n{out[-3000:]}"
    )


def dashboards_match_the_committed_ones(tmp: Path, out: str) -> None:
    committed = sorted((REPO_ROOT / "grafana" / "dashboards").glob("*.json"))
    assert [p.name for p in committed] == sorted(p.name for p in (tmp / "dashboards").glob("*.json"))
    assert all((tmp / "dashboards" / p.name).read_bytes() == p.read_bytes() for p in committed)


def grafana_files_in_place(tmp: Path, out: str) -> None:
    root = tmp / "root"
    assert (root / "etc/grafana/provisioning/datasources/memexporter.yml").is_file()
    assert (root / "etc/grafana/provisioning/dashboards/memexporter.yml").is_file()
    assert len(list((root / "var/lib/grafana/dashboards/memexporter").glob("*.json"))) == 3


def kubernetes_renderings(tmp: Path, out: str) -> None:
    rule = yaml.safe_load((tmp / "memexporter-rules.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["metadata"]["namespace"] == "monitoring"
    assert (
        rule["metadata"]["labels"]["release"] == "kps"
        and 'job="trainer"' in (tmp / "memexporter-rules.yaml").read_text()
    )
    maps = [d for d in yaml.safe_load_all((tmp / "memexporter-dashboards.yaml").read_text()) if d]
    assert {d["kind"] for d in maps} == {"ConfigMap"} and len(maps) == 3
    assert len(list((tmp / "root/var/lib/grafana/dashboards/memexporter").glob("*.json"))) == 3


def oom_dump_dir_made(tmp: Path, out: str) -> None:
    assert (tmp / "oom").is_dir(), out[-3000:]


def vmalert_installed(tmp: Path, out: str) -> None:
    root = tmp / "root"
    assert (root / "etc/memexporter/alerts/memexporter.rules.yml").read_bytes() == (
        REPO_ROOT / "alerts/memexporter.rules.yml"
    ).read_bytes()
    assert (root / "etc/default/vmalert").is_file() and (root / "etc/systemd/system/vmalert.service").is_file()


def sweep_outputs(tmp: Path, out: str) -> None:
    runs = json.loads((tmp / "sweep.json").read_text())["runs"]
    assert [r["params"] for r in runs] == [{"batch": 8, "seq": 64}, {"batch": 16, "seq": 64}], runs
    assert all(r["fits"] and r["peak_bytes"] > 0 for r in runs), runs
    assert (tmp / "sweep.csv").read_text().count("\n") == 3 and (tmp / "sweep.png").stat().st_size > 10_000


TRAIN = textwrap.dedent("""\
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(30):
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
""")
QUICK_LEAK = {"MEMEXPORTER_LEAK_WINDOW": "24"}  # the estimate over 24 steps, not 200: seconds, not a minute

PLAN: dict[tuple[str, str], Run | Elsewhere] = {
    (
        "README.md",
        "scripts/demo.sh     # set up, then train a small GPT with memexporter on: open http://localhost:9400/",
    ): Run(
        "the demo runs until Ctrl-C: here 5 steps on a free port; scripts/test.sh is the command CI runs, this test among its tests",
        edits=(
            ("scripts/demo.sh     #", "scripts/demo.sh --steps 5 --port {port}  #"),
            ("scripts/test.sh     #", "true  #"),
        ),
        check=readme_demo_line,
    ),
    ("README.md", "scripts/demo.sh --leak-mib-per-step 8 --memory-limit-mib 3072 --step-interval 0.2"): Run(
        "60 steps on a free port (the simulated OOM would come after about 330), the leak window 24 steps",
        edits=(("--step-interval 0.2", "--step-interval 0.2 --steps 60 --warmup-steps 5 --port {port}"),),
        env=QUICK_LEAK,
        expect=(r"leak [1-9][0-9.]* MiB/step \| OOM ETA \d",),
    ),
    (
        "README.md",
        'pip install "memexporter[nvml]"     # NVIDIA; [amdsmi] on AMD; plain memexporter on Intel, Apple or CPU',
    ): Elsewhere(
        "installs from PyPI", "test_pip_lines_name_extras_the_package_has (here) and tests/integration/test_package.py"
    ),
    ("docs/dashboards.md", "# data source: edit the URL to where Grafana reaches Prometheus"): Run(
        "Grafana's folders under a temporary root",
        setup="mkdir -p {root}/etc/grafana/provisioning/datasources {root}/etc/grafana/provisioning/dashboards",
        check=grafana_files_in_place,
    ),
    ("docs/dashboards.md", "docker run -p 3000:3000 \\"): Elsewhere(
        "no container engine in CI",
        "tests/integration/test_compose.py::test_grafana_provisioning_reaches_the_dashboards_and_prometheus",
    ),
    ("docs/dashboards.md", "python -m memexporter.dashboards          # writes grafana/dashboards/*.json"): Run(
        "written to a temporary folder (other tests read the checkout's), then compared with the committed files",
        edits=(
            (
                "python -m memexporter.dashboards          #",
                "python -m memexporter.dashboards --out {tmp}/dashboards  #",
            ),
        ),
        check=dashboards_match_the_committed_ones,
    ),
    ("docs/debugging.md", "MEMEXPORTER_DEBUG=1 MEMEXPORTER_OOM_DUMP_DIR=/scratch/$USER/oom torchrun ... train.py"): Run(
        "the dump folder temporary; the demo, 20 steps, as train.py",
        timeout=300,
        edits=(
            ("/scratch/$USER/oom", "{tmp}/oom"),
            (
                "torchrun ... train.py",
                "torchrun --standalone --nproc-per-node=1 -m memexporter demo --steps 20 --port {port}",
            ),
        ),
        expect=(r"memexporter demo: training",),
        check=oom_dump_dir_made,
    ),
    ("docs/deploy.md", "cd deploy/compose && docker compose up --build"): Elsewhere(
        "no container engine in CI", "tests/integration/test_compose.py"
    ),
    ("docs/deploy.md", "docker compose logs -f webhook"): Elsewhere(
        "no container engine in CI",
        "tests/integration/test_compose.py::test_shipped_routing_pages_through_the_webhook_receiver",
    ),
    (
        "docs/deploy.md",
        "docker build -t memexporter .                   # python:3.11-slim + torch's CPU build",
    ): Elsewhere(
        "no container engine or registry in CI", "tests/integration/test_image.py (builds with podman where installed)"
    ),
    (
        "docs/deploy.md",
        "kubectl apply -k deploy/kubernetes      # PrometheusRule + dashboard ConfigMaps + PodMonitor, namespace monitoring",
    ): Elsewhere(
        "no cluster in CI",
        "tests/integration/test_kubernetes.py (kubectl kustomize, promtool) and tests/unit/cli/test_kube.py (the CRD schema)",
    ),
    ("docs/deploy.md", "memexporter rules --format prometheusrule --namespace monitoring --label release=kps \\"): Run(
        "in a temporary folder",
        cwd="tmp",
        expect=(r"wrote 3 dashboards? to .*/var/lib/grafana/dashboards/memexporter",),
        check=kubernetes_renderings,
    ),
    (
        "docs/deploy.md",
        'pip install memexporter            # or: pip install ".[nvml]" from a checkout; torch >= 2.8 must be there',
    ): Elsewhere(
        "installs from PyPI; the build and twine check take a minute and run once",
        "tests/integration/test_package.py (python -m build, twine check --strict, the wheel installed)",
    ),
    (
        "docs/otel.md",
        "pip install 'memexporter[otel]'        # the SDK and the OTLP/HTTP exporter; 'memexporter[otel-grpc]' adds gRPC",
    ): Run(
        "a local OTLP receiver for the collector, a push every 0.5 s, a 30-step train.py",
        edits=(
            ("http://otel-collector:4318", "{otlp}"),
            ("OTEL_METRIC_EXPORT_INTERVAL=15000", "OTEL_METRIC_EXPORT_INTERVAL=500"),
            ("memexporter run train.py", "memexporter run {tmp}/train.py"),
        ),
        setup=f"cat > {{tmp}}/train.py <<'EOF'\n{TRAIN}EOF",
        otlp=True,
    ),
    ("docs/scaling.md", "promtool check config --agent deploy/victoriametrics/prometheus-agent.yml"): Run(
        # Killed 5 s after the interrupt: with nothing at the remote-write URL, the agent's queue
        # would wait out its one-minute flush deadline (70 s of the suite's time instead of 15).
        "the agent runs 10 s on a free port, then stops",
        expect=(r"SUCCESS", r"Server is ready to receive web requests"),
        edits=(
            (
                "prometheus --enable-feature=agent",
                "timeout -s INT -k 5 10 prometheus --web.listen-address=127.0.0.1:{port} --enable-feature=agent",
            ),
            (
                "--storage.agent.path=/var/lib/prometheus/agent\n",
                "--storage.agent.path=/var/lib/prometheus/agent || case $? in 124 | 137) ;; *) false ;; esac\n",
            ),
        ),
    ),
    ("docs/scaling.md", "vmalert -dryRun -rule=alerts/memexporter.rules.yml"): Run(
        "installed under a temporary root; no systemd in CI (the unit: tests/integration/test_victoriametrics_setup.py)",
        setup="mkdir -p {root}/etc/default {root}/etc/systemd/system",
        edits=(("sudo systemctl daemon-reload && sudo systemctl enable --now vmalert", "true"),),
        check=vmalert_installed,
    ),
    (
        "docs/scaling.md",
        '{ echo "namespace: memexporter"; cat alerts/memexporter.rules.yml; } > memexporter.mimir.yml',
    ): Elsewhere(
        "mimirtool is packaged by neither Debian nor PyPI, and there is no Mimir",
        "tests/integration/test_promtool.py (the same rules)",
    ),
    ("docs/sweep.md", "pip install 'memexporter[plot]'   # matplotlib, for --plot"): Run(
        "two small runs of 3 steps (the page's sweep takes 12 minutes), the outputs in a temporary folder",
        timeout=360,
        edits=(
            ("--grid batch=8,16,32,64,128 --grid seq=64,128", "--grid batch=8,16 --grid seq=64 --steps 3"),
            (
                "--json sweep.json --csv sweep.csv --plot docs/sweep-demo.png",
                "--json {tmp}/sweep.json --csv {tmp}/sweep.csv --plot {tmp}/sweep.png",
            ),
        ),
        expect=(
            r"#\s+batch\s+seq\s+peak\s+baseline\s+params\s+grads\s+optim\s+activ\s+step\s+headroom\s+result",
            r"largest that fits, measured:\s+batch=16 seq=64",
        ),
        check=sweep_outputs,
    ),
}


def adjust(text: str) -> str:
    """What every block gets: memexporter's own ``pip install`` not run, no ``sudo``, a temporary root."""
    text = PIP_SELF.sub("true  # pip install memexporter", text)
    text = re.sub(r"(^|&& )sudo ", r"\1", text, flags=re.M)
    return re.sub(r"(?<![\w.])/(etc|var/lib)/", r"{root}/\1/", text)


def test_every_shell_block_is_planned_and_every_plan_has_its_block() -> None:
    found = set(blocks())
    assert not found - set(PLAN), f"shell blocks in the docs that no test runs or names: {sorted(found - set(PLAN))}"
    assert not set(PLAN) - found, f"PLAN entries whose block is gone: {sorted(set(PLAN) - found)}"


def test_pip_lines_name_extras_the_package_has() -> None:
    extras = set(importlib.metadata.metadata("memexporter").get_all("Provides-Extra") or ())  # what pip resolves
    text = "".join((REPO_ROOT / page).read_text(encoding="utf-8") for page in PAGES)
    named = {e for group in re.findall(r"memexporter\[([\w,-]+)\]", text) for e in group.split(",")}
    assert {"nvml", "amdsmi", "top", "otel", "plot"} <= named, named  # what the docs tell users to install
    assert named <= extras, f"extras the docs install that the package lacks: {sorted(named - extras)}"


def test_blocks_not_run_here_name_a_test_that_exists() -> None:
    for (page, first), plan in PLAN.items():
        if isinstance(plan, Elsewhere):
            path = plan.test.split("::")[0].split(" ")[0]
            if path.startswith("tests/"):
                assert (REPO_ROOT / path).is_file(), f"{page}: {first}: {plan.test}"


RUNS = [key for key, plan in PLAN.items() if isinstance(plan, Run)]


@pytest.mark.slow
@pytest.mark.parametrize("key", RUNS, ids=[f"{page}:{first[:40]}" for page, first in RUNS])
def test_the_block_runs_and_prints_what_the_text_says(key: tuple[str, str], tmp_path: Path) -> None:
    plan = PLAN[key]
    assert isinstance(plan, Run)
    text = blocks()[key]
    for written, run in plan.edits:
        assert written in text, f"the edit {written!r} no longer matches {key}: update PLAN"
        text = text.replace(written, run)
    with contextlib.ExitStack() as stack:
        receiver = None
        if plan.otlp:
            pytest.importorskip(
                "opentelemetry.exporter.otlp.proto.http", reason="needs pip install 'memexporter[otel]'"
            )
            from tests.support.otlp import OtlpHttpReceiver, metrics

            receiver = stack.enter_context(OtlpHttpReceiver())
        fill = {
            "{port}": str(free_port()),
            "{tmp}": str(tmp_path),
            "{root}": str(tmp_path / "root"),
            "{otlp}": receiver.endpoint if receiver else "",
        }
        script = f"set -euo pipefail\ncd {REPO_ROOT if plan.cwd == 'repo' else tmp_path}\n{plan.setup}\n{adjust(text)}"
        for token, value in fill.items():
            script = script.replace(token, value)
        (tmp_path / "block.sh").write_text(script)
        env = module_env(plan.env)
        env.pop("MEMEXPORTER_STRICT")  # the commands as a user runs them
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env["PATH"]))
        log = tmp_path / "out.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                ["bash", str(tmp_path / "block.sh")],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=plan.timeout)
            finally:
                stop(proc)
        out = log.read_text(errors="replace")
        assert rc == 0, f"{key[0]}: the block failed ({rc}):\n{script}\n---\n{tail(log)}"
        for pattern in plan.expect:
            assert re.search(pattern, out), f"{key[0]}: no {pattern!r} in what the block printed:\n{tail(log)}"
        if plan.check:
            plan.check(tmp_path, out)
        if receiver:
            assert any("memexporter.memory.used" in metrics(r) for r in receiver.snapshot()), "nothing was pushed"
