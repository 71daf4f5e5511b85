"""Issue 5's live end-to-end check, nothing mocked: the demo leaks toward its budget; a real
Prometheus scrapes it with `memexporter rules --preset demo`; a real Alertmanager routes with the
shipped `alertmanager/alertmanager.example.yml` (only its placeholder webhook URLs point at this test).
The warning must reach the chat webhook before the demo hits its simulated OOM; the lead time
is printed and recorded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from memexporter.demo import SIMULATED_OOM_EXIT
from tests.support import REPO_ROOT
from tests.support.alertmanager import WebhookReceiver, running_alertmanager
from tests.support.demo import running_demo
from tests.support.ports import free_port
from tests.support.prometheus import running_prometheus
from tests.support.rules import render_preset

pytestmark = pytest.mark.integration

# ~2 MiB/s toward a 1 GiB budget (5 steps/s at most): 60 % of the budget after ~2.5 min and the
# simulated OOM after ~6 min on an idle box; a busy box steps slower, which only adds lead time.
DEMO_ARGS = ("--layers", "1", "--d-model", "64", "--seq-len", "32", "--batch-size", "4", "--step-interval", "0.2",
             "--warmup-steps", "5", "--memory-limit-mib", "1024", "--leak-mib-per-step", "0.4")


def routed_example(tmp: Path, webhook: str) -> Path:
    """The shipped routing example with its placeholder receivers pointing at the test's webhook."""
    text = (REPO_ROOT / "alertmanager" / "alertmanager.example.yml").read_text()
    for placeholder, path in (("http://pager.example.invalid/memexporter", "pager"),
                              ("http://chat.example.invalid/memexporter", "chat")):
        assert placeholder in text, f"the example no longer has the {placeholder} placeholder"
        text = text.replace(placeholder, webhook + path)
    out = tmp / "alertmanager.yml"
    out.write_text(text)
    return out


def firing(alertname: str) -> Any:
    return lambda payload: any(a["labels"].get("alertname") == alertname and a["status"] == "firing"
                               for a in payload.get("alerts", []))


def test_page_arrives_before_the_simulated_oom(tmp_path: Path, record_property: Any) -> None:
    port = free_port()
    rules = render_preset(tmp_path / "rules", "demo")
    with WebhookReceiver() as hook, running_alertmanager(routed_example(tmp_path, hook.url)) as am, \
            running_demo(port, *DEMO_ARGS, timeout=90) as demo, \
            running_prometheus([f"127.0.0.1:{port}"], [rules], alertmanager_url=am.url) as prom:
        started = time.time()
        prom.wait_targets_up(timeout=30)
        warning = hook.wait_for(firing("MemexporterOOMPredicted"), timeout=600)
        assert warning.path == "/chat", "warnings route to the chat receiver"
        assert demo.poll() is None, "the warning must arrive while the job still runs"
        rc = demo.wait(timeout=600)
        oom = time.time()
        assert rc == SIMULATED_OOM_EXIT
        lead = oom - warning.time
        (alert,) = [a for a in warning.payload["alerts"] if a["labels"]["alertname"] == "MemexporterOOMPredicted"]
        assert alert["labels"]["severity"] == "warning" and alert["labels"]["rank"] == "0"
        assert alert["annotations"]["runbook_url"].endswith("#memexporteroomimminent".replace("imminent", "predicted"))
        critical = [r for r in hook.received if firing("MemexporterOOMImminent")(r.payload)]
        summary = (f"OOMPredicted reached the chat webhook {warning.time - started:.0f} s after start and "
                   f"{lead:.0f} s before the simulated OOM; OOMImminent paged: "
                   f"{f'{oom - critical[0].time:.0f} s before the OOM' if critical else 'not before the OOM'}")
        print(summary)
        record_property("lead_seconds", round(lead))
        assert lead > 0
        if critical:
            assert critical[0].path == "/pager", "critical alerts route to the pager"
