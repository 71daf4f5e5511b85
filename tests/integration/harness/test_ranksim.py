"""The rank simulator (tests/support/ranksim.py) serves memexporter's own exposition, rank by rank.

The expositions are made once for the module by the exporter itself (``rank_exposition.generate``:
a fresh interpreter, the demo's 12-layer model, the SYNTHETIC A100 stand-ins), as rank 0 and rank 8
of a 64-rank run: a detail rank and a core rank under ``detail_ranks=auto``.
"""

from __future__ import annotations

import gzip
import http.client
import re
import subprocess
import time
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.support.binaries import require
from tests.support.rank_exposition import AUTOMATIC_PHASES, CONTRACT_DETAIL, RUN_INFO, adapt, core_only, generate
from tests.support.ranksim import CPU_FOLLOWS, FOLLOWS, MiB, RankSim, Template
from tests.support.ranksim_server import OPENMETRICS, TEXT, RankServers

# The templates come from real exporters in subprocesses (a module fixture): one worker makes them once.
pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=40), pytest.mark.xdist_group("ranksim")]

RUN = "unit-run"


@pytest.fixture(scope="module")
def made() -> dict[str, dict[str, Any]]:
    return {"representative": generate(64, 0, RUN), "core": generate(64, 8, RUN)}


@pytest.fixture(scope="module")
def templates(made: dict[str, dict[str, Any]]) -> dict[str, Template]:
    return {kind: Template.parse(kind, adapt(m, kind, RUN)) for kind, m in made.items()}


def samples(body: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value for f in parse_text(body) for s in f.samples}


def sim_of(templates: dict[str, Template], ranks: int, policy: str = "after") -> RankSim:
    kinds = templates if policy == "after" else {"before": templates["representative"]}
    return RankSim(kinds, ranks, policy, RUN)  # type: ignore[arg-type]


def test_bodies_parse_and_pass_promtool(templates: dict[str, Template]) -> None:
    sim = sim_of(templates, 64)
    now = time.time()  # one instant for every body: the values follow the clock (CI read 15 s apart)
    for r in (0, 8, 63):
        text, om = sim.body(r, False, False, now).decode(), sim.body(r, True, False, now).decode()
        assert samples(text), r
        families = parse_openmetrics(om)  # type: ignore[no-untyped-call]
        assert {s.name for f in families for s in f.samples} >= {"memexporter_steps_total", RUN_INFO}
        assert om.endswith("# EOF\n")
        check = subprocess.run(
            [require("promtool"), "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert gzip.decompress(sim.body(r, True, True, now)).decode() == om


def test_ranks_differ_only_where_they_should(templates: dict[str, Template]) -> None:
    sim = sim_of(templates, 64)
    now = time.time()
    own = {"rank", "local_rank", "hostname", "uuid", "gpu_uuid", "pci_bus_id"}

    def normalised(r: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {
            (n, frozenset((k, v) for k, v in labels if k not in own)): value
            for (n, labels), value in samples(sim.body(r, False, False, now).decode()).items()
        }

    nine, ten = normalised(9), normalised(10)
    assert nine.keys() == ten.keys()
    moved = {name for (name, labels), v in nine.items() if ten[(name, labels)] != v}
    assert moved and moved <= set(FOLLOWS) | CPU_FOLLOWS
    assert "memexporter_steps_total" not in moved  # every rank steps together
    info = [dict(labels) for (name, labels) in samples(sim.body(9, False, False, now).decode()) if name == RUN_INFO]
    assert info == [{"rank": "9", "run_id": RUN, "run_id_source": "memexporter", "detail": "core"}]
    identity = [
        dict(labels)
        for (name, labels) in samples(sim.body(9, False, False, now).decode())
        if name == "memexporter_process_info"
    ]
    assert identity[0]["local_rank"] == "1" and identity[0]["world_size"] == "64"


def test_core_and_detail_split(templates: dict[str, Template]) -> None:
    after, before = sim_of(templates, 1024), sim_of(templates, 1024, "before")
    names = {r: {name for name, _, _ in after.series(r)} for r in (0, 7, 8, 1023)}
    assert {r for r, n in names.items() if "memexporter_module_parameter_bytes" in n} == {0, 7}
    for r in (8, 1023):
        assert not names[r] & CONTRACT_DETAIL
        assert not any(n.startswith("memexporter_module_") for n in names[r])
        phases = {labels.get("phase") for name, labels, _ in after.series(r) if name.startswith("memexporter_phase_")}
        assert not phases & set(AUTOMATIC_PHASES)
    details = {labels["detail"] for r in (0, 8) for name, labels, _ in after.series(r) if name == RUN_INFO}
    assert details == {"representative", "core"}
    per_rank = sum(sum(1 for _ in after.series(r)) for r in range(after.ranks)) / after.ranks + 5  # + up, scrape_*
    full = sum(1 for _ in before.series(0)) + 5
    assert per_rank <= 60 < full, (per_rank, full)


def test_the_contract_filter_matches_the_exporter(
    made: dict[str, dict[str, Any]], templates: dict[str, Template]
) -> None:
    """``core_only`` (for an exporter that does not filter itself) cuts what the exporter cuts."""
    full = made["representative"]
    cut = {
        (n, frozenset(labels.items()))
        for n, labels, _ in Template.parse("core", {**full, "openmetrics": core_only(full["openmetrics"])}).samples()
    }
    own = {(n, frozenset(labels.items())) for n, labels, _ in templates["core"].samples()}

    def plain(keys: set[tuple[str, frozenset[tuple[str, str]]]]) -> set[tuple[str, frozenset[tuple[str, str]]]]:
        drop = {"rank", "local_rank", "detail"}
        return {
            (n, frozenset(kv for kv in labels if kv[0] not in drop))
            for n, labels in keys
            if n != "memexporter_collector_success"
        }  # a core rank does not run the modules collector

    assert plain(cut) == plain(own)


def value(sim: RankSim, r: int, name: str, at: float, device: str = "cuda:0") -> float:
    return next(t.at(at) for n, labels, t in sim.series(r) if n == name and labels.get("device", device) == device)


def test_a_leak_grows_memory_and_trips_the_shipped_thresholds(templates: dict[str, Template]) -> None:
    sim = sim_of(templates, 64)
    start = time.time() - 2 * 3600
    sim.set_leak("all", start=start)
    now = start + 2 * 3600
    limit = value(sim, 9, "memexporter_memory_limit_bytes", now)
    used = [value(sim, 9, "memexporter_memory_used_bytes", t) for t in (now, now + 600)]
    assert used[1] - used[0] == pytest.approx(sim.leak_rate * 600)
    rate = value(sim, 9, "memexporter_leak_rate_bytes_per_second", now)
    assert rate * 3600 / limit > 0.01  # MemexporterMemoryLeak's growth threshold
    assert value(sim, 9, "memexporter_memory_peak_bytes", now) / limit > 0.5  # OOMPredicted's level
    assert value(sim, 9, "memexporter_oom_eta_seconds", now) < 7200  # and its horizon
    assert value(sim, 9, "memexporter_oom_eta_seconds", start - 1) == float("inf")
    sim.set_leak(3, start=start)
    assert value(sim, 9, "memexporter_leak_rate_bytes_per_second", now) == 0
    assert value(sim, 3, "memexporter_leak_rate_bytes_per_second", now) == sim.leak_rate
    assert sim.leak_rate == 4 * MiB


def test_the_step_counter_advances(templates: dict[str, Template]) -> None:
    sim = sim_of(templates, 64)
    now = time.time()
    steps = [value(sim, 5, "memexporter_steps_total", t, "") for t in (now, now + 30)]
    assert steps[1] - steps[0] == pytest.approx(30 / sim.step_seconds, abs=1)
    last = value(sim, 5, "memexporter_last_step_timestamp_seconds", now, "")
    assert now - sim.step_seconds < last <= now
    assert (
        float(
            re.sub(
                r".* ",
                "",
                next(
                    line
                    for line in sim.body(5, False, False, now + 30).decode().splitlines()
                    if line.startswith("memexporter_steps_total")
                ),
            )
        )
        >= steps[0]
    )


def get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> tuple[int, dict[str, Any], bytes]:
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read()


def test_served_per_rank_as_memexporter_serves(templates: dict[str, Template]) -> None:
    sim = sim_of(templates, 3, "before")
    with RankServers(sim) as servers:
        host, port = servers.targets[2].split(":")
        assert int(port) == servers.base_port + 2
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        status, headers, body = get(
            conn, "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"}
        )
        assert (status, headers["Content-Type"], headers["Content-Encoding"]) == (200, OPENMETRICS, "gzip")
        assert 'rank="2"' in gzip.decompress(body).decode()
        status, headers, body = get(conn, "/metrics", {})  # the same connection: keep-alive
        assert (status, headers["Content-Type"]) == (200, TEXT) and samples(body.decode())
        assert get(conn, "/nothing", {})[0] == 404
        conn.close()
        assert servers.requests == [0, 0, 2]
