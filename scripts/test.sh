#!/usr/bin/env bash
# Set everything up, then run every check CI runs: ruff, mypy, generated-file drift, and the
# test suite (unit, integration against real Prometheus/promtool/Alertmanager; CUDA tests skip
# with a reason when there is no GPU). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
VPY="${MEMEXPORTER_VENV:-.venv}/bin/python"
export MEMEXPORTER_REQUIRE_BINARIES=1   # missing binaries fail the run instead of skipping
echo "[test] ruff"; "$VPY" -m ruff format --check memexporter tests benchmarks; "$VPY" -m ruff check memexporter tests benchmarks
echo "[test] mypy"; "$VPY" -m mypy
echo "[test] generated files"; "$VPY" -m memexporter.cli.generate --check
# Tests run in parallel processes (pytest-xdist): the long live tests mostly wait on real
# Prometheus/Alertmanager and a training demo, so they overlap with the rest. --dist loadgroup
# keeps each xdist_group (tests sharing one expensive fixture) on one worker. Slow tests name
# themselves as they start and end (tests/support/progress.py). MEMEXPORTER_TEST_WORKERS=1: serial.
workers="${MEMEXPORTER_TEST_WORKERS:-4}"
echo "[test] pytest ($workers workers)"
set +e
if [[ "$workers" == "1" ]]; then
  "$VPY" -m pytest -q "$@"
else
  "$VPY" -m pytest -q -n "$workers" --dist loadgroup "$@"
fi
rc=$?
set -e
# pytest exits 5 when it collected nothing: that is a broken suite, not a pass.
[[ $rc -eq 5 ]] && { echo "[test] pytest collected no tests" >&2; exit 1; }
exit $rc
