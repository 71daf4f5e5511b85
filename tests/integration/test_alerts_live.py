"""The alerts end to end, nothing mocked: the demo leaks toward its budget; a real Prometheus scrapes
it with `memexporter rules --preset demo` (rendered into the test's folder); a real Alertmanager
routes with the shipped `alertmanager/alertmanager.example.yml` (only its placeholder webhook URLs
point at this test). Lead times are printed and recorded.

- A young job (issue 9): 1 MiB a step from the first step, 0.2 s a step, toward a 1200 MiB budget,
  about 2.5 minutes from start to the simulated OOM. The warning must reach the chat webhook at
  least 30 s before the demo stops; after the stop, MemexporterFatalOOMSuspected says it probably
  died of an OOM, and the Overview dashboard's annotation marks the moment.
- A slower leak (issue 5): 0.4 MiB a step toward 1 GiB. The warning and then the critical page
  arrive while the demo still runs; the test stops there instead of waiting for the OOM.

Each test has its own ports, folders and processes, and spends its minutes waiting: they are
marked slow and can run concurrently with each other and with the rest of the suite.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memexporter import dashboards
from memexporter.cli.demo import SIMULATED_OOM_EXIT
from tests.support.alertmanager import Received, WebhookReceiver, routed_example, running_alertmanager
from tests.support.demo import SMALL_MODEL, running_demo
from tests.support.ports import free_port
from tests.support.process import tail
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.promql import substitute
from tests.support.rules import render_preset

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = (*SMALL_MODEL, "--step-interval", "0.2")
# The young job: 1 MiB a step from the first step; the demo's default warm-up.
YOUNG = (*TINY, "--memory-limit-mib", "1200", "--leak-mib-per-step", "1")
# The slower leak: ~2 MiB/s toward 1 GiB, 60 % of the budget after ~2.5 min, the OOM after ~6 min
# on an idle box; a busy box steps slower, which only adds lead time.
SLOW = (*TINY, "--warmup-steps", "5", "--memory-limit-mib", "1024", "--leak-mib-per-step", "0.4")


def firing(alertname: str) -> Any:
    return lambda payload: any(
        a["labels"].get("alertname") == alertname and a["status"] == "firing" for a in payload.get("alerts", [])
    )


def the_alert(received: Received, alertname: str) -> dict[str, Any]:
    (alert,) = [a for a in received.payload["alerts"] if a["labels"]["alertname"] == alertname]
    assert isinstance(alert, dict)
    assert alert["labels"]["rank"] == "0" and alert["labels"].get("device", "cpu") == "cpu"  # per rank: no device
    assert alert["annotations"]["runbook_url"].endswith("#" + alertname.lower())
    return alert


@contextlib.contextmanager
def live_chain(tmp: Path, *demo_args: str) -> Iterator[tuple[WebhookReceiver, subprocess.Popen[bytes], Prometheus]]:
    """The demo with ``demo_args``, a Prometheus with the demo preset scraping it, the shipped
    Alertmanager example routing to a webhook: all on free ports, in ``tmp``, stopped afterwards.
    The demo trains on one thread: its tiny model gains nothing from two, and on a shared machine
    spinning threads would only take CPU from the tests that run beside it."""
    port = free_port()
    rules = render_preset(tmp / "rules", "demo")
    with (
        WebhookReceiver() as hook,
        running_alertmanager(routed_example(tmp, hook.url)) as am,
        running_demo(port, *demo_args, env={"OMP_NUM_THREADS": "1"}, timeout=90, log=tmp / "demo.log") as demo,
        running_prometheus([f"127.0.0.1:{port}"], [rules], alertmanager_url=am.url) as prom,
    ):
        prom.wait_targets_up(timeout=30)
        yield hook, demo, prom


def warned(hook: WebhookReceiver, demo: subprocess.Popen[bytes], timeout: float, log: Path) -> Received:
    """The first MemexporterOOMPredicted notification: on the chat receiver, while the demo runs
    (``log``: the demo's output, shown when it stopped first)."""
    warning = hook.wait_for(firing("MemexporterOOMPredicted"), timeout=timeout)
    assert warning.path == "/chat", "warnings route to the chat receiver"
    assert the_alert(warning, "MemexporterOOMPredicted")["labels"]["severity"] == "warning"
    assert demo.poll() is None, (
        f"the warning must arrive while the job still runs; the demo exited with {demo.returncode}:\n{tail(log)}"
    )
    return warning


@pytest.mark.slow(seconds=200, waits=True)
def test_young_demo_is_warned_before_it_stops(tmp_path: Path, record_property: Any) -> None:
    with live_chain(tmp_path, *YOUNG) as (hook, demo, prom):
        started = time.time()
        warning = warned(hook, demo, timeout=300, log=tmp_path / "demo.log")
        rc = demo.wait(timeout=300)
        stopped = time.time()
        assert rc == SIMULATED_OOM_EXIT
        lead = stopped - warning.time
        print(
            f"young demo: OOMPredicted reached the chat webhook {warning.time - started:.0f} s after start, "
            f"{lead:.0f} s before the simulated OOM at {stopped - started:.0f} s"
        )
        record_property("young_lead_seconds", round(lead))
        assert lead >= 30, f"the warning arrived only {lead:.0f} s before the demo stopped (issue 9: >= 30 s)"

        # The stop is a process gone at its budget: the fatal-OOM alert says so, with the last figures.
        died = hook.wait_for(firing("MemexporterFatalOOMSuspected"), timeout=120)
        alert = the_alert(died, "MemexporterFatalOOMSuspected")
        assert died.path == "/chat"
        assert "probably died of an out-of-memory error" in alert["annotations"]["description"]
        # Its last step peak, from the alert's own value (no template query, issue 25): at its budget.
        last = re.search(r"reached ([\d.]+)% of its limit", alert["annotations"]["description"])
        assert last and float(last.group(1)) > 90, alert["annotations"]["description"]
        print(f"young demo: MemexporterFatalOOMSuspected arrived {died.time - stopped:.0f} s after the stop")
        # The Overview dashboard marks the moment, through its annotation query on this Prometheus.
        notes = dashboards.build()["memexporter-overview.json"]["annotations"]["list"]
        (note,) = [n for n in notes if n.get("name") == "probable fatal OOM"]
        (mark,) = prom.query(substitute(note["expr"], {"job": "memexporter"}))
        assert abs(float(mark["value"][1]) / 1000 - stopped) < 15, (mark, stopped)


@pytest.mark.slow(seconds=300, waits=True)
def test_page_arrives_before_the_simulated_oom(tmp_path: Path, record_property: Any) -> None:
    with live_chain(tmp_path, *SLOW) as (hook, demo, prom):
        started = time.time()
        warning = warned(hook, demo, timeout=600, log=tmp_path / "demo.log")
        page = hook.wait_for(firing("MemexporterOOMImminent"), timeout=600)
        assert page.path == "/pager", "critical alerts route to the pager"
        assert the_alert(page, "MemexporterOOMImminent")["labels"]["severity"] == "critical"
        assert demo.poll() is None, "the page must arrive while the job still runs"
        # The demo's own reading of its budget: how far the OOM still is when the page arrives.
        budget = prom.query('memexporter_memory_limit_bytes{job="memexporter",device="cpu"}')
        used = prom.query('memexporter_memory_used_bytes{job="memexporter",device="cpu"}')
        headroom_mib = (float(budget[0]["value"][1]) - float(used[0]["value"][1])) / (1 << 20)
        print(
            f"slow leak: OOMPredicted on chat at {warning.time - started:.0f} s, OOMImminent on the pager at "
            f"{page.time - started:.0f} s with {headroom_mib:.0f} MiB to go (~{headroom_mib / 2:.0f} s at 2 MiB/s)"
        )
        record_property("page_headroom_mib", round(headroom_mib))
        assert headroom_mib > 0


@pytest.mark.slow(seconds=140, waits=True)
def test_stalled_demo_pages_while_its_process_is_up(tmp_path: Path, record_property: Any) -> None:
    # Issue 23: a job that stops stepping (a hung collective) keeps its memory flat and every
    # memory alert quiet. The demo steps 40 times, then hangs with its process up.
    with live_chain(tmp_path, *TINY, "--stall-after-steps", "40") as (hook, demo, _):
        started = time.time()
        page = hook.wait_for(firing("MemexporterTrainingStalled"), timeout=400)
        assert page.path == "/pager", "a stalled run pages"
        alert = the_alert(page, "MemexporterTrainingStalled")
        assert alert["labels"]["severity"] == "critical"
        assert "has not finished a training step" in alert["annotations"]["description"]
        assert demo.poll() is None, "the page must come while the process is still up"
        record_property("stalled_page_seconds", round(page.time - started))
        print(f"stalled demo: MemexporterTrainingStalled paged {page.time - started:.0f} s after start")
