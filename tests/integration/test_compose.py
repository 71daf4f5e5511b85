"""deploy/compose/ checked without a container engine (none runs on this machine: ``docker`` here is
only a client, and no registry is reachable to pull the images).

Every config the stack mounts is read from where compose would mount it, with the container paths
mapped back into the repository, and checked by the real tools: ``promtool check config`` (with the
rules the one-shot ``rules`` service renders), ``amtool check-config``, Debian's ``docker-compose``
for the compose schema. The Grafana provisioning is followed path by path to the dashboards.
The receiver and the shipped routing run for real: Alertmanager posts to ``webhook.py``.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

import memexporter
from memexporter import cli, dashboards, rules
from memexporter.cli.demo import add_arguments
from tests.support import REPO_ROOT
from tests.support.alertmanager import running_alertmanager
from tests.support.binaries import require
from tests.support.ports import free_port
from tests.support.probe import seconds
from tests.support.process import running_command

HERE = REPO_ROOT / "deploy" / "compose"
COMPOSE = HERE / "compose.yaml"
PINNED = re.compile(r"^[a-z0-9./-]+:v?\d+\.\d+\.\d+(@sha256:[0-9a-f]{64})?$")
VARIABLE = re.compile(r"\$\{(\w+):-([^}]*)\}")


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text(encoding="utf-8")))


def _service(name: str) -> dict[str, Any]:
    return dict(_compose()["services"][name])


def _expand(text: str, **env: str) -> str:
    """Compose's ``${NAME:-default}`` interpolation."""
    return VARIABLE.sub(lambda m: env.get(m.group(1), m.group(2)), text)


def _mounts(service: dict[str, Any], volumes: Path) -> dict[str, Path]:
    """``{container path: host path}``: bind mounts resolved against this folder, named volumes as
    folders under ``volumes`` (what the one-shot services write there, the test writes there)."""
    out = {}
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        out[target] = (HERE / source).resolve() if source.startswith((".", "/")) else volumes / source
    return out


def _host_path(container_path: str, mounts: dict[str, Path]) -> Path:
    """Where ``container_path`` lives in the repository (the longest mount prefix wins)."""
    for target in sorted(mounts, key=len, reverse=True):
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return (
                mounts[target] / container_path[len(target) :].lstrip("/")
                if container_path != target
                else mounts[target]
            )
    raise AssertionError(f"{container_path} is not under any mount: {sorted(mounts)}")


def _flag(command: list[str], name: str) -> str:
    """The value of ``--name=value`` or ``--name value`` in a command list."""
    for i, arg in enumerate(command):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name:
            return command[i + 1]
    raise AssertionError(f"{name} not in {command}")


def test_compose_schema_with_docker_compose(tmp_path: Path) -> None:
    """Debian's docker-compose (v1.29) validates the file against the compose schema without an
    engine. It predates the top-level ``name`` of the compose spec, so that one key is left out."""
    binary = require("docker-compose")
    text = "".join(
        line for line in COMPOSE.read_text(encoding="utf-8").splitlines(keepends=True) if not line.startswith("name:")
    )
    (tmp_path / "compose.yaml").write_text(text, encoding="utf-8")
    result = subprocess.run(
        [binary, "-f", str(tmp_path / "compose.yaml"), "--project-directory", str(HERE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert _compose()["name"] == "memexporter"


def test_images_are_pinned_or_built_from_this_repository() -> None:
    for name, service in _compose()["services"].items():
        image = service["image"]
        if "build" in service:
            assert (HERE / service["build"]["context"]).resolve() == REPO_ROOT
            assert (REPO_ROOT / service["build"].get("dockerfile", "Dockerfile")).is_file()
            assert image.split(":")[1].startswith(memexporter.__version__), f"{name}: tag {image} is not this version"
            assert service["pull_policy"] == "build", f"{name}: a local image must not be pulled"
        else:
            assert PINNED.match(image), f"{name}: {image} is not pinned to a full version"


def test_every_bind_mount_exists_as_what_it_replaces(tmp_path: Path) -> None:
    mounted = 0
    for name, service in _compose()["services"].items():
        for target, source in _mounts(service, tmp_path).items():
            if source.is_relative_to(tmp_path):
                assert target.split(":")[0] and source.name in _compose()["volumes"], f"{name}: unknown volume {source}"
                continue
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
            assert source.is_file() == bool(re.search(r"\.(ya?ml|py|json)$", target)), f"{name}: {source} -> {target}"
            mounted += 1
    assert mounted >= 6


def test_long_running_services_have_healthchecks_and_dependencies_wait_for_them() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        one_shot = service.get("restart") == "no"
        assert one_shot or service["healthcheck"]["test"][0] == "CMD", f"{name} has no healthcheck"
        for dependency, condition in service.get("depends_on", {}).items():
            wanted = (
                "service_completed_successfully" if services[dependency].get("restart") == "no" else "service_healthy"
            )
            assert condition == {"condition": wanted}, f"{name} -> {dependency}"
    assert _service("demo")["healthcheck"]["test"] == ["CMD", "python", "-m", "memexporter.healthcheck"]


def _render_rules(volumes: Path, preset: str | None) -> Path:
    """Run the one-shot ``rules`` service's command here, writing into its volume's folder."""
    service = _service("rules")
    env = {} if preset is None else {"MEMEXPORTER_RULES_PRESET": preset}
    command = [_expand(arg, **env) for arg in service["command"]]
    out = _host_path(_flag(command, "--output"), _mounts(service, volumes))
    out.parent.mkdir(parents=True, exist_ok=True)
    command[command.index("--output") + 1] = str(out)
    assert cli.main(command) == 0
    return out


@pytest.mark.parametrize("preset", [None, "default"])
def test_prometheus_config_and_the_rendered_rules_pass_promtool(tmp_path: Path, preset: str | None) -> None:
    rendered = _render_rules(tmp_path, preset)
    expected = rules.render(preset or "demo")
    assert rendered.read_text(encoding="utf-8") == expected
    if preset == "default":  # the production rules: exactly the committed file
        assert expected == (REPO_ROOT / "alerts" / "memexporter.rules.yml").read_text(encoding="utf-8")

    service = _service("prometheus")
    mounts = _mounts(service, tmp_path)
    config_path = _host_path(_flag(service["command"], "--config.file"), mounts)
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    config["rule_files"] = [str(_host_path(p, mounts)) for p in config["rule_files"]]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    result = subprocess.run(
        [require("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(g["rules"]) for g in yaml.safe_load(expected)["groups"])
    assert "SUCCESS: 1 rule files found" in result.stdout
    assert f"SUCCESS: {count} rules found" in result.stdout

    # The scrape job is the one the rules select, at the demo service's port; alerts go to Alertmanager.
    (job,) = config["scrape_configs"]
    assert f'job="{job["job_name"]}"' == rules.RulesConfig.selector
    (target,) = job["static_configs"][0]["targets"]
    assert target == "demo:9400" and "9400:9400" in _service("demo")["ports"]
    (am,) = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am == "alertmanager:9093" and "9093:9093" in _service("alertmanager")["ports"]
    # The demo preset assumes scrapes and evaluations every 5 s or less.
    assert config["global"]["scrape_interval"] == config["global"]["evaluation_interval"] == "1s"


def _alertmanager_config(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    service = _service("alertmanager")
    path = _host_path(_flag(service["command"], "--config.file"), _mounts(service, tmp_path))
    return path, yaml.safe_load(path.read_text(encoding="utf-8"))


def test_alertmanager_runs_the_shipped_example_and_its_receivers_resolve_to_the_webhook(tmp_path: Path) -> None:
    path, config = _alertmanager_config(tmp_path)
    assert path == REPO_ROOT / "alertmanager" / "alertmanager.example.yml"
    result = subprocess.run(
        [require("amtool"), "check-config", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    webhook = _service("webhook")
    aliases = set(webhook["networks"]["default"]["aliases"])
    port = int(_flag(webhook["command"], "--port"))
    urls = [c["url"] for r in config["receivers"] for c in r.get("webhook_configs", [])]
    assert len(urls) == 2
    for url in urls:  # inside the compose network, each placeholder host is the webhook service
        parts = urlsplit(url)
        assert parts.hostname in aliases and (parts.port or 80) == port, url
    assert webhook["sysctls"]["net.ipv4.ip_unprivileged_port_start"] == 0 or port >= 1024


def test_grafana_provisioning_reaches_the_dashboards_and_prometheus(tmp_path: Path) -> None:
    service = _service("grafana")
    mounts = _mounts(service, tmp_path)
    providers = [
        p
        for f in sorted(_host_path("/etc/grafana/provisioning/dashboards", mounts).glob("*.y*ml"))
        for p in yaml.safe_load(f.read_text(encoding="utf-8"))["providers"]
    ]
    assert providers, "no dashboard provider is provisioned"
    uids = []
    for provider in providers:
        folder = _host_path(provider["options"]["path"], mounts)
        files = sorted(folder.glob("*.json"))
        assert files, f"provider {provider['name']} points at {provider['options']['path']}, which holds no dashboard"
        uids += [json.loads(f.read_text(encoding="utf-8"))["uid"] for f in files]
    assert sorted(uids) == sorted(d["uid"] for d in dashboards.build().values())
    assert len(set(uids)) == len(uids)
    home = _host_path(service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"], mounts)
    assert json.loads(home.read_text(encoding="utf-8"))["uid"] == "memexporter-overview"

    # The data source: the shipped one but for the URL (the prometheus service) and the scrape interval.
    source = _host_path("/etc/grafana/provisioning/datasources/prometheus.yml", mounts)
    compose_ds = yaml.safe_load(source.read_text(encoding="utf-8"))
    shipped = yaml.safe_load(
        (REPO_ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text(encoding="utf-8")
    )
    (ds,), (ref,) = compose_ds["datasources"], shipped["datasources"]
    assert ds["url"] == "http://prometheus:9090" and "9090:9090" in _service("prometheus")["ports"]
    prometheus = yaml.safe_load((HERE / "prometheus.yml").read_text(encoding="utf-8"))
    assert ds["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]
    for d in (ds, ref):
        d.pop("url")
        d["jsonData"].pop("timeInterval")
    assert compose_ds == shipped


def test_the_demo_command_is_valid_and_leaks_toward_a_budget() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(_service("demo")["command"][1:])
    assert args.leak_mib_per_step > 0 and args.memory_limit_mib, "without a leak and a budget no page arrives"
    # Same leak speed as scripts/walkthrough.sh, whose page arrival the live alert test measures.
    assert args.leak_mib_per_step / args.step_interval == pytest.approx(2.0)


def test_the_demo_stays_down_after_its_oom_until_the_fatal_oom_alert_is_out(tmp_path: Path) -> None:
    # The entrypoint's shell, run for real with stand-ins for memexporter and sleep on the PATH.
    # What compose hands the container: "$$" is its escape for a literal "$".
    entrypoint = [part.replace("$$", "$") for part in _service("demo")["entrypoint"]]
    command = _service("demo")["command"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("memexporter", 'echo "memexporter $*" >> "$LOG"; exit "$RC"'),
        ("sleep", 'echo "sleep $*" >> "$LOG"'),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)

    def run(rc: int) -> tuple[int, list[str]]:
        log = tmp_path / f"log-{rc}"
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), "RC": str(rc)}
        done = subprocess.run([*entrypoint, *command], env=env, timeout=30, check=False)
        return done.returncode, log.read_text(encoding="utf-8").splitlines()

    code, calls = run(0)  # a normal end: no pause
    assert code == 0 and calls == [f"memexporter {' '.join(command)}"]
    code, calls = run(3)  # the simulated OOM: the same exit code, after a pause
    assert code == 3 and calls[0] == f"memexporter {' '.join(command)}" and calls[1].startswith("sleep ")
    pause = float(calls[1].split()[1])
    # Long enough for the alert: its `for` in the demo preset, the FatalOOMSuspected route's
    # group_wait, and a few scrapes and evaluations (every second here). The demo is one rank:
    # its per-rank alert (scope "rank") is the one that fires, not the run-wide one.
    demo_rules = yaml.safe_load(rules.render("demo"))
    (fatal,) = [
        r
        for g in demo_rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "MemexporterFatalOOMSuspected" and r["labels"].get("scope", "rank") == "rank"
    ]
    routing = yaml.safe_load((REPO_ROOT / "alertmanager" / "alertmanager.example.yml").read_text(encoding="utf-8"))
    (route,) = [r for r in routing["route"]["routes"] if "MemexporterFatalOOMSuspected" in str(r.get("matchers"))]
    needed = seconds(fatal["for"]) + seconds(route["group_wait"]) + 10
    assert pause >= needed, f"the demo restarts after {pause:.0f} s; the alert needs {needed:.0f} s"


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(64)


@pytest.mark.slow(seconds=30, waits=True)
@pytest.mark.integration
def test_shipped_routing_pages_through_the_webhook_receiver(tmp_path: Path) -> None:
    """A real Alertmanager with the mounted example config (its placeholder hosts pointed at the
    receiver, as the compose network's aliases do) and ``webhook.py`` logging what arrives: the
    critical alert reaches the pager, the warning the chat, one line each."""
    _, config = _alertmanager_config(tmp_path)
    port = free_port()
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{port}{urlsplit(hook['url']).path}"
    log = tmp_path / "webhook.log"
    receiver_argv = [sys.executable, str(HERE / "webhook.py"), "--addr", "127.0.0.1", "--port", str(port)]
    with (
        running_command(receiver_argv, [f"http://127.0.0.1:{port}/healthz"], log=log, what="webhook"),
        running_alertmanager(config) as am,
    ):
        assert _post(f"http://127.0.0.1:{port}/", b"{not json") == 400  # a stray client is refused...
        assert _post(f"http://127.0.0.1:{port}/", b"[1, 2]") == 400
        assert _raw(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n").startswith(b"HTTP/1.0 400")
        assert _raw(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n").startswith(b"HTTP/1.0 413")
        check = subprocess.run([*receiver_argv[:2], "--check", "--port", str(port)], timeout=30, check=False)
        assert check.returncode == 0  # ...and the receiver keeps serving
        common = {"job": "memexporter", "instance": "demo:9400", "device": "cpu"}
        alerts = [
            {
                "labels": {**common, "alertname": "MemexporterOOMImminent", "severity": "critical", "rank": "0"},
                "annotations": {"summary": "Training memory is about to run out."},
            },
            {
                "labels": {**common, "alertname": "MemexporterMemoryLeak", "severity": "warning", "rank": "1"},
                "annotations": {"summary": "Memory held between training steps keeps growing."},
            },
        ]
        assert _post(f"{am.url}/api/v2/alerts", json.dumps(alerts).encode()) == 200
        deadline = time.monotonic() + 90  # the example's group_wait: 30 s for pages and for chat
        while time.monotonic() < deadline:
            text = log.read_text(encoding="utf-8")
            if "training-pager" in text and "training-chat" in text:
                break
            time.sleep(1)
    output = log.read_text(encoding="utf-8")
    assert "Traceback" not in output  # the bad requests were answered, not crashed on
    lines = [line for line in output.splitlines() if "Memexporter" in line]
    assert len(lines) == 2, lines
    pager = next(line for line in lines if "training-pager" in line)
    chat = next(line for line in lines if "training-chat" in line)
    assert re.search(r"training-pager +firing +MemexporterOOMImminent \(critical\) rank 0 cpu: Training memory", pager)
    assert re.search(r"training-chat +firing +MemexporterMemoryLeak \(warning\) rank 1 cpu: Memory held", chat)


def test_the_webhook_receiver_logs_no_traceback_for_clients_that_hang_up(tmp_path: Path) -> None:
    # Clients that send a request and reset the connection before the answer is written: each was
    # once a socketserver traceback in the notification log (43 of 100 such clients, and a flaky
    # test above).
    port, log = free_port(), tmp_path / "webhook.log"
    argv = [sys.executable, str(HERE / "webhook.py"), "--addr", "127.0.0.1", "--port", str(port)]
    with running_command(argv, [f"http://127.0.0.1:{port}/healthz"], log=log, what="webhook"):
        for request in (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{not",
        ) * 20:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(request)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        time.sleep(0.5)
        assert _post(f"http://127.0.0.1:{port}/", b'{"receiver": "r", "alerts": []}') == 200  # still serving
    output = log.read_text(encoding="utf-8")
    assert "Traceback" not in output and "Exception" not in output, output[:2000]
