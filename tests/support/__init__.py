"""Test harness shared by the unit and integration tests: real binaries, free ports, processes.

- ``binaries``: find Prometheus, promtool, Alertmanager, amtool; ``require()`` skips (or fails under
  ``MEMEXPORTER_REQUIRE_BINARIES=1``) with the binary and its Debian package named.
- ``prometheus.running_prometheus`` / ``alertmanager.running_alertmanager``: the real servers on
  loopback, in a temporary folder, stopped afterwards. ``alertmanager.WebhookReceiver`` records
  notifications.
- ``demo.running_demo`` / ``demo.running_torchrun_demo`` / ``process.running_command``:
  ``memexporter demo`` (alone or under torchrun) and other commands as subprocesses, ready once
  their HTTP endpoints answer, stopped with their whole process group.
- ``fixtures``: the fixtures of the whole suite, a pytest plugin that ``tests/conftest.py`` registers:
  ``no_exporter``, ``otel_push_environment``, ``dead_pid``, a temporary ``$XDG_RUNTIME_DIR``.
- ``web.get_text``: a URL's text (``/metrics``, ``/live.json``) with a timeout; ``web.http_status``
  and ``http_ok`` for what a starting process answers.
- ``ports``: free loopback ports (``free_port``, ``free_port_block`` for port + LOCAL_RANK).
- ``promql``: metric names in an expression, variable substitution, ``promtool check rules``.
- ``forked.run_forked``: checks run inside a forked child (a DataLoader worker), reported to the
  parent over a pipe: the child's memory is a copy, so only it can say what it saw.
- ``cuda_standins`` / ``nvml_standin``: torch.cuda's public functions and the ``pynvml`` module
  answering from a fixture (``tests/fixtures``), so the real CUDA and NVML backends run on CPU;
  ``memory_stats`` / ``synthetic_fixtures``: the shape of ``memory_stats()`` per torch version and
  the SYNTHETIC fixtures built from it (the CUDA ones in ``synthetic_cuda``, the other device families
  in ``synthetic_families``); ``fixture_checks``: what a scrape over a fixture must give.
- ``rules``: a rules preset rendered into the test's own folder (``render_preset``).
- ``traces``, ``scenarios``, ``scenario_defs``: SYNTHETIC per-step traces scraped through the real
  trend estimator into promtool scenarios (``python -m tests.support.scenarios`` writes them);
  ``probe``: when each alert of a scenario fires, asked of promtool at every evaluation.
- ``healthy_demo``: the demo's own loop in fresh forked processes, its ETA read after every step.
- ``frameworks``: ``/metrics`` read as Prometheus would and the bytes module rows must add up to,
  from the live tensors' element counts, for the tests under real frameworks (HF, Lightning,
  accelerate, DDP, FSDP2); ``callback_trainers``: the small Lightning and HF ``Trainer`` runs of the
  framework callback tests.
- ``victoriametrics``: VictoriaMetrics single-node, vmalert (the flags of deploy/victoriametrics/vmalert.default)
  and a Prometheus agent that remote-writes to it.
- ``ranksim`` (with ``rank_exposition``, ``ranksim_server``): N simulated ranks of one or more runs in one
  process, each serving the exporter's own exposition (rendered by memexporter over SYNTHETIC CUDA
  stand-ins), for the paging test and ``benchmarks/bench_scale.py``; ``tsdb_blocks``: their history
  backfilled into Prometheus blocks.

``tests/integration/harness/`` tests the harness itself (``test_harness.py``: against the real binaries).
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["REPO_ROOT"]
