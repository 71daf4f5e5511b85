"""A real Prometheus scrapes the real demo job (real torch on CPU): every contract series that
exists on a CPU box is queryable through Prometheus' HTTP API."""

from __future__ import annotations

import pytest

from memexporter.metrics import SPECS
from tests.support.demo import SMALL_MODEL, running_demo
from tests.support.ports import free_port
from tests.support.prometheus import running_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The demo's model is not sharded; the end's rows come only after the job has ended (test_job_end.py);
# the demo declares its largest input, and the capacity, which needs inputs of several sizes, is checked
# where the demo's lengths vary (tests/integration/test_input_capacity_cpu.py).
DECLARED = 4096
CPU_SPECS = [
    s
    for s in SPECS
    if not s.cuda_only
    and not s.sharded_only
    and s.collector != "ending"
    and s.needs in ("", "max_input_elements declared")
]


def test_contract_series_are_queryable_in_prometheus() -> None:
    port = free_port()
    with (
        running_demo(
            port,
            *SMALL_MODEL,
            *("--leak-mib-per-step", "2", "--warmup-steps", "5", "--step-interval", "0.1"),
            *("--max-input-elements", str(DECLARED)),
        ),
        running_prometheus([f"127.0.0.1:{port}"]) as prom,
    ):
        prom.wait_targets_up(timeout=30)
        # enough steps for the trend window to report: the warm-up (5 steps, and 5 s: ~50 steps at
        # 10 steps/s), then the minimum points (32) spanning 3 s, and a scrape to carry it
        prom.wait_for('memexporter_steps_total{job="memexporter"} > 100', timeout=120)
        prom.wait_for('memexporter_leak_bytes_per_step{job="memexporter", device="cpu"} > 0', timeout=15)
        missing = []
        for spec in CPU_SPECS:
            result = prom.query(f'{spec.name}{{job="memexporter", rank="0"}}')
            if not result:
                missing.append(spec.name)
        assert not missing, f"not in Prometheus: {missing}"
        (leak,) = prom.query('memexporter_leak_bytes_per_step{job="memexporter", device="cpu"}')
        assert float(leak["value"][1]) > 1 << 20, "the 2 MiB/step leak shows through Prometheus"
        assert prom.query('memexporter_collector_success{job="memexporter"} == 0') == []
