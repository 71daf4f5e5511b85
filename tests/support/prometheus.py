"""A real Prometheus server for a test: ``with running_prometheus([target]) as prom: prom.query(...)``."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.binaries import require
from tests.support.process import start_on_free_port, tail

Sample = dict[str, Any]


class QueryError(RuntimeError):
    """Prometheus answered a query with an error (bad PromQL, say)."""


def http_json(url: str, data: bytes | None = None, timeout: float = 10.0) -> Any:
    """GET (or POST ``data``) and decode JSON; Prometheus' 4xx bodies are JSON too."""
    req = urllib.request.Request(url, data=data)
    if data is not None:
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            return json.loads(body)
        except ValueError:
            raise QueryError(f"{url}: HTTP {err.code}: {body[:500]!r}") from None


class QueryApi:
    """The Prometheus HTTP query API over ``self.url``, for Prometheus and for the servers that
    answer it too (VictoriaMetrics). ``form`` is sent with every call; ``_unsatisfied`` says what
    a ``wait_for`` that timed out should add to its error."""

    url: str
    form: Mapping[str, str] = {}

    def api(self, path: str, **params: str) -> Any:
        """``/api/v1/<path>`` with form parameters (POST, so long PromQL fits); returns ``data``."""
        params = {**params, **self.form}
        body = http_json(f"{self.url}/api/v1/{path}", urllib.parse.urlencode(params).encode() if params else None)
        if body.get("status") != "success":
            raise QueryError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, time_: float | None = None) -> list[Sample]:
        """Instant query; a list of ``{"metric": {...}, "value": [ts, "v"]}``. Scalars and strings
        come back as one sample with empty labels."""
        params = {"query": expr} | ({"time": f"{time_:.3f}"} if time_ is not None else {})
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> list[Sample]:
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step)
        return list(data["result"])

    def wait_for(
        self,
        expr: str,
        timeout: float = 30.0,
        predicate: Callable[[list[Sample]], bool] = bool,
        interval: float = 0.5,
    ) -> list[Sample]:
        """Poll ``expr`` until ``predicate(result)`` (default: non-empty); the last result, or
        ``TimeoutError`` naming the query, its last result and ``_unsatisfied()``."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{expr!r} not satisfied after {timeout:.0f} s; last result {result}{self._unsatisfied()}"
                )
            time.sleep(interval)

    def _unsatisfied(self) -> str:
        return ""


@dataclass
class Prometheus(QueryApi):
    """A running server. ``url`` has no trailing slash; ``workdir`` holds config, data and log."""

    url: str
    workdir: Path
    config: Mapping[str, Any]
    proc: subprocess.Popen[bytes]

    @property
    def log(self) -> str:
        return tail(self.workdir / "prometheus.log")

    def _unsatisfied(self) -> str:
        health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.targets()]
        return f"; targets {health}"

    def targets(self) -> list[dict[str, Any]]:
        """The active targets (``scrapeUrl``, ``health``, ``lastError``, ``labels``...)."""
        return list(self.api("targets")["activeTargets"])

    def wait_targets_up(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until every active target has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout
        while True:
            targets = self.targets()
            if targets and all(t["health"] == "up" for t in targets):
                return targets
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"targets not up after {timeout:.0f} s: "
                    f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}"
                )
            time.sleep(0.5)

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts (``labels``, ``state``, ``annotations``, ``value``)."""
        return list(self.api("alerts")["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        """Rule groups as loaded, with each rule's ``health`` and ``lastError``."""
        return list(self.api("rules")["groups"])


def _am_config(url: str) -> dict[str, Any]:
    parts = urllib.parse.urlsplit(url)
    am: dict[str, Any] = {
        "scheme": parts.scheme or "http",
        "static_configs": [{"targets": [parts.netloc]}],
        "api_version": "v2",
    }
    if parts.path.strip("/"):
        am["path_prefix"] = parts.path
    return {"alertmanagers": [am]}


def prometheus_config(
    targets: Sequence[str],
    rule_files: Sequence[Path] = (),
    *,
    alertmanager_url: str | None = None,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
    job: str = "memexporter",
) -> dict[str, Any]:
    """The config ``running_prometheus`` writes: one static job (``job``) for ``targets``."""
    config: dict[str, Any] = {
        # scrape_timeout defaults to 10s, which must not exceed a 1s scrape interval.
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": evaluation_interval,
        },
        "rule_files": [str(Path(f).resolve()) for f in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}] if targets else [],
    }
    config["scrape_configs"] += [dict(c) for c in extra_scrape_configs]
    if alertmanager_url:
        config["alerting"] = _am_config(alertmanager_url)
    return config


@contextlib.contextmanager
def running_prometheus(
    targets: Sequence[str],
    rule_files: Sequence[Path] = (),
    *,
    alertmanager_url: str | None = None,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
    job: str = "memexporter",
    resend_delay: str = "1s",
    startup_timeout: float = 60.0,
) -> Iterator[Prometheus]:
    """Run ``/usr/bin/prometheus`` on a free loopback port, scraping ``targets`` (``host:port``)
    as ``job``; config, TSDB and log live in a temporary folder removed afterwards. Yields once
    ``/-/ready`` answers; stops the server (SIGTERM, wait, SIGKILL) on exit.

    ``resend_delay`` (``--rules.alert.resend-delay``, 1m in production) is short because
    Prometheus drops the first notification of an alert that fires before its Alertmanager is
    discovered (a few seconds after start), and would otherwise resend it only a minute later.
    """
    binary = require("prometheus")
    config = prometheus_config(
        targets,
        rule_files,
        alertmanager_url=alertmanager_url,
        scrape_interval=scrape_interval,
        evaluation_interval=evaluation_interval,
        extra_scrape_configs=extra_scrape_configs,
        job=job,
    )
    with tempfile.TemporaryDirectory(prefix="memexporter-prometheus-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        config_file = workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        port, proc = start_on_free_port(
            stack,
            lambda port: [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
                f"--rules.alert.resend-delay={resend_delay}",
            ],
            "/-/ready",
            workdir / "prometheus.log",
            what="prometheus",
            timeout=startup_timeout,
        )
        yield Prometheus(f"http://127.0.0.1:{port}", workdir, config, proc)
