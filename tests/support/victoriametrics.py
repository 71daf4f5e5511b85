"""VictoriaMetrics single-node, ``vmalert`` and a Prometheus agent that feeds them, for a test.

    with running_victoriametrics() as vm, \\
            running_prometheus_agent([target], vm.write_url) as agent, \\
            running_vmalert(vm.url, [rules], notifier_url=am.url) as vmalert:
        vm.wait_for("up")            # the Prometheus HTTP API: query, query_range
        vmalert.alerts()             # what vmalert holds firing or pending

Each runs the real binary (Debian's ``victoria-metrics`` package, 1.79) on a free loopback port
with its data in a temporary folder removed afterwards, as ``prometheus.py`` does for Prometheus.
The vmalert flags come from ``deploy/victoriametrics/vmalert.default`` (the documented set-up),
with only the addresses, rule files and intervals replaced (``vmalert_args``).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.process import start_on_free_port, tail
from tests.support.prometheus import Prometheus, QueryApi, http_json
from tests.support.web import get_text

DEPLOY = REPO_ROOT / "deploy" / "victoriametrics"
VMALERT_DEFAULT = DEPLOY / "vmalert.default"
AGENT_CONFIG = DEPLOY / "prometheus-agent.yml"
# The addresses the shipped examples use, replaced by the test's own.
EXAMPLE_VM_URL = "http://127.0.0.1:8428"
EXAMPLE_AM_URL = "http://127.0.0.1:9093"


@dataclass
class VictoriaMetrics(QueryApi):
    """A running single-node server; ``url`` (no trailing slash) serves the Prometheus query API.

    Queries go with ``nocache=1``, as vmalert's shipped ``-datasource.url`` sends them: otherwise
    an instant query for "now" answers as of ``-search.latencyOffset`` ago (30 s by default). A
    range query leaves out its last ``-search.latencyOffset`` even so (1.79): a test that reads
    seconds-old data in ranges starts the server with a shorter one."""

    url: str
    workdir: Path
    proc: subprocess.Popen[bytes]
    form: Mapping[str, str] = field(default_factory=lambda: {"nocache": "1"})

    @property
    def write_url(self) -> str:
        """Where Prometheus ``remote_write`` and ``vmalert -remoteWrite.url`` send samples."""
        return f"{self.url}/api/v1/write"

    @property
    def log(self) -> str:
        return tail(self.workdir / "victoria-metrics.log")

    def _unsatisfied(self) -> str:
        return f"; VictoriaMetrics at {self.url}"


@contextlib.contextmanager
def running_victoriametrics(
    extra_flags: Sequence[str] = (), startup_timeout: float = 60.0
) -> Iterator[VictoriaMetrics]:
    """``victoria-metrics`` on a free loopback port, storage in a temporary folder, otherwise as
    Debian's package runs it (its ``-search.latencyOffset`` of 30 s included: vmalert's
    ``?nocache=1`` in the shipped ``-datasource.url`` is what reads the last 30 s)."""
    binary = require("victoria-metrics")
    with tempfile.TemporaryDirectory(prefix="memexporter-vm-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        port, proc = start_on_free_port(
            stack,
            lambda port: [
                binary,
                f"-storageDataPath={workdir / 'data'}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=1d",
                *extra_flags,
            ],
            "/health",
            workdir / "victoria-metrics.log",
            what="victoria-metrics",
            timeout=startup_timeout,
        )
        yield VictoriaMetrics(f"http://127.0.0.1:{port}", workdir, proc)


def agent_config(targets: Sequence[str], remote_write_url: str, scrape_interval: str = "1s") -> dict[str, Any]:
    """``deploy/victoriametrics/prometheus-agent.yml`` with the test's targets, interval and
    VictoriaMetrics, the rest as shipped; the remote-write queue sends at least every second
    (``batch_send_deadline``, 5 s by default), at the test's pace."""
    config: dict[str, Any] = yaml.safe_load(AGENT_CONFIG.read_text(encoding="utf-8"))
    config["global"] = {
        **config.get("global", {}),
        "scrape_interval": scrape_interval,
        "scrape_timeout": scrape_interval,
    }
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": list(targets)}]
    (remote,) = config["remote_write"]
    remote["url"] = remote_write_url
    remote.setdefault("queue_config", {})["batch_send_deadline"] = "1s"
    return config


@contextlib.contextmanager
def running_prometheus_agent(
    targets: Sequence[str], remote_write_url: str, *, scrape_interval: str = "1s", startup_timeout: float = 60.0
) -> Iterator[Prometheus]:
    """Prometheus in agent mode (``--enable-feature=agent``: scrape and ``remote_write``, no local
    queries or rules) scraping ``targets``. The ``Prometheus`` it yields answers ``targets()``
    and ``wait_targets_up()``; it has no query API."""
    binary = require("prometheus")
    config = agent_config(targets, remote_write_url, scrape_interval)
    with tempfile.TemporaryDirectory(prefix="memexporter-agent-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        config_file = workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        port, proc = start_on_free_port(
            stack,
            lambda port: [
                binary,
                "--enable-feature=agent",
                f"--config.file={config_file}",
                f"--storage.agent.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            "/-/ready",
            workdir / "prometheus.log",
            what="prometheus agent",
            timeout=startup_timeout,
        )
        yield Prometheus(f"http://127.0.0.1:{port}", workdir, config, proc)


def shipped_vmalert_args() -> list[str]:
    """The flags of ``deploy/victoriametrics/vmalert.default`` (its ``ARGS="..."``), as the shell
    that sources it would split them."""
    for line in VMALERT_DEFAULT.read_text(encoding="utf-8").replace("\\\n", " ").splitlines():
        if line.startswith("ARGS="):
            return shlex.split(shlex.split(line.removeprefix("ARGS="))[0])
    raise AssertionError(f"{VMALERT_DEFAULT} has no ARGS= line")


def vmalert_args(
    datasource_url: str,
    rule_files: Sequence[Path],
    *,
    notifier_url: str | None,
    evaluation_interval: str = "1s",
    overrides: Mapping[str, str | None] | None = None,
) -> list[str]:
    """The shipped vmalert flags pointed at the test: its VictoriaMetrics (read, write, restore),
    Alertmanager (``notifier_url``; none: the flag is dropped) and rule files; ``overrides`` sets
    (or with None removes) any other flag by name."""
    out: list[str] = []
    for arg in shipped_vmalert_args():
        name = arg.split("=", 1)[0]
        if name in ("-rule", "-httpListenAddr") or (name == "-notifier.url" and notifier_url is None):
            continue
        out.append(arg.replace(EXAMPLE_VM_URL, datasource_url).replace(EXAMPLE_AM_URL, notifier_url or ""))
    changes = {"-evaluationInterval": evaluation_interval, **(overrides or {})}
    out = [a for a in out if a.split("=", 1)[0] not in changes]
    out += [f"{name}={value}" for name, value in changes.items() if value is not None]
    return out + [f"-rule={Path(f).resolve()}" for f in rule_files]


@dataclass
class VMAlert:
    """A running vmalert; ``url`` (no trailing slash) serves its own API and ``/metrics``."""

    url: str
    workdir: Path
    argv: list[str]
    proc: subprocess.Popen[bytes]

    @property
    def log(self) -> str:
        return tail(self.workdir / "vmalert.log")

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts (``name``, ``labels``, ``annotations``, ``state``, ``value``)."""
        return list(http_json(f"{self.url}/api/v1/alerts")["data"]["alerts"] or [])  # null when none

    def rules(self) -> list[dict[str, Any]]:
        """Rule groups as loaded, each rule with ``lastError`` (empty when the last evaluation worked)."""
        return list(http_json(f"{self.url}/api/v1/rules")["data"]["groups"] or [])

    def metric(self, name: str) -> float:
        """The sum of the samples of ``name`` on vmalert's own ``/metrics`` (0 when absent)."""
        text = get_text(f"{self.url}/metrics")
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + "{", name + " "))
        )


@contextlib.contextmanager
def running_vmalert(
    datasource_url: str,
    rule_files: Sequence[Path],
    *,
    notifier_url: str | None = None,
    evaluation_interval: str = "1s",
    overrides: Mapping[str, str | None] | None = None,
    startup_timeout: float = 60.0,
) -> Iterator[VMAlert]:
    """``vmalert`` on a free loopback port with the shipped flags (``vmalert_args``)."""
    binary = require("vmalert")
    args = vmalert_args(
        datasource_url,
        rule_files,
        notifier_url=notifier_url,
        evaluation_interval=evaluation_interval,
        overrides=overrides,
    )
    with tempfile.TemporaryDirectory(prefix="memexporter-vmalert-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        argv: list[str] = []

        def argv_for(port: int) -> list[str]:
            argv[:] = [binary, *args, f"-httpListenAddr=127.0.0.1:{port}"]
            return argv

        port, proc = start_on_free_port(
            stack, argv_for, "/health", workdir / "vmalert.log", what="vmalert", timeout=startup_timeout
        )
        yield VMAlert(f"http://127.0.0.1:{port}", workdir, list(argv), proc)


def vmalert_dry_run(rule_files: Sequence[Path]) -> subprocess.CompletedProcess[str]:
    """``vmalert -dryRun -rule=...``: parses every rule file, each expression (MetricsQL) and
    template, and exits non-zero naming the first that fails."""
    binary = require("vmalert")
    return subprocess.run(
        [binary, "-dryRun", *(f"-rule={Path(f).resolve()}" for f in rule_files)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
