"""A real Prometheus for ``bench_scale.py``: on a data folder the benchmark filled, and what it costs.

``Prom`` starts ``/usr/bin/prometheus`` (Debian's 2.42 here) on a free loopback port over a given
TSDB folder, scraping the simulated ranks as job ``memexporter`` with the given rule files, and
reads back: its own ``/metrics`` (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
``prometheus_tsdb_head_series``, ``prometheus_rule_group_last_duration_seconds``), peak RSS from
``/proc``, each rule group's ``evaluationTime`` (``/api/v1/rules``), the alerts, and the wall time
and size of a query's answer as a client (Grafana's backend) sees them.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.binaries import find
from tests.support.process import start_on_free_port
from tests.support.prometheus import prometheus_config


def binary(name: str) -> str:
    path = find(name)
    if path is None:
        raise SystemExit(f"bench_scale: {name} not found (apt-get install prometheus)")
    return path


@dataclass
class Answer:
    """One query's answer: client-side wall seconds, body bytes, series in the result, error text."""

    seconds: float
    nbytes: int
    series: int
    error: str = ""


class Prom:
    """A Prometheus over ``data`` (see the module doc); ``targets`` empty: no scraping, no rules."""

    def __init__(
        self, workdir: Path, data: Path, targets: Sequence[str], rule_files: Sequence[Path] = (), scrape_s: float = 15.0
    ) -> None:
        self.workdir, self.data = workdir, data
        workdir.mkdir(parents=True, exist_ok=True)
        config = prometheus_config(
            targets, rule_files, scrape_interval=f"{scrape_s:g}s", evaluation_interval=f"{scrape_s:g}s"
        )
        config["global"]["scrape_timeout"] = f"{min(scrape_s, 10.0):g}s"  # Prometheus' default, at most
        self.config_file = workdir / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self._stack = contextlib.ExitStack()
        self._started: float | None = None

    def __enter__(self) -> Prom:
        argv = [
            binary("prometheus"),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data}",
            "--web.enable-lifecycle",
        ]
        port, self.proc = start_on_free_port(
            self._stack,
            lambda p: [*argv, f"--web.listen-address=127.0.0.1:{p}"],
            "/-/ready",
            self.workdir / "prometheus.log",
            what="prometheus",
            timeout=600,
        )
        self.url = f"http://127.0.0.1:{port}"
        return self

    @property
    def started(self) -> float:
        """When the process started (Unix s), from its own ``process_start_time_seconds``."""
        if self._started is None:
            self._started = self.one(self.own_metrics(), "process_start_time_seconds")
        return self._started

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _get(self, path: str, params: dict[str, str] | None = None, timeout: float = 300.0, post: bool = True) -> bytes:
        query = urllib.parse.urlencode(params) if params else ""
        if post:
            req = urllib.request.Request(self.url + path, data=query.encode() if query else None)
        else:  # an endpoint that answers GET only (label values)
            req = urllib.request.Request(self.url + path + ("?" + query if query else ""))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read()  # type: ignore[no-any-return]
        except urllib.error.HTTPError as err:
            return err.read()

    def api(self, path: str, **params: str) -> Any:
        body = json.loads(self._get(f"/api/v1/{path}", params or None, post=not path.startswith("label/")))
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def timed(self, path: str, **params: str) -> Answer:
        """``/api/v1/<path>`` (POST, as Grafana's backend sends it), timed from the client."""
        t0 = time.perf_counter()
        raw = self._get(f"/api/v1/{path}", params, post=not path.startswith("label/"))
        took = time.perf_counter() - t0
        body = json.loads(raw)
        if body.get("status") != "success":
            return Answer(took, len(raw), 0, f"{body.get('errorType')}: {body.get('error')}"[:300])
        data = body["data"]
        series = len(data["result"]) if isinstance(data, dict) and isinstance(data.get("result"), list) else len(data)
        return Answer(took, len(raw), series)

    def own_metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Prometheus' own ``/metrics``: name -> [(labels, value)]."""
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(self._get("/metrics").decode()):
            for s in family.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def one(self, metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
        return sum(v for _, v in metrics.get(name, []))

    def peak_rss(self) -> int:
        """``VmHWM``: the most resident memory the process held since it started, in bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def rule_groups(self) -> dict[str, tuple[str, float]]:
        """``group name -> (lastEvaluation, evaluationTime in s)`` as ``/api/v1/rules`` says now."""
        return {
            g["name"]: (g.get("lastEvaluation", ""), float(g.get("evaluationTime", 0.0)))
            for g in self.api("rules")["groups"]
        }

    def scalar(self, expr: str) -> float:
        """An instant query's single value (0 when the result is empty)."""
        result = self.api("query", query=expr)["result"]
        return float(result[0]["value"][1]) if result else 0.0

    def up_count(self) -> int:
        """Targets scraped successfully by this server (the backfilled ``up`` is older than its start)."""
        return int(self.scalar(f'count(up{{job="memexporter"}} == 1 and timestamp(up) > {self.started:.3f})'))

    def wait_up(self, count: int, timeout: float) -> float:
        """Seconds until every target has answered a scrape; ``TimeoutError`` naming how many did."""
        t0 = time.monotonic()
        while (up := self.up_count()) < count:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{up} of {count} targets up after {timeout:.0f} s")
            time.sleep(1.0)
        return time.monotonic() - t0
