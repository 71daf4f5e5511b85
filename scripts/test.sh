#!/usr/bin/env bash
# Set everything up, then run every check CI runs: ruff, mypy, generated-file drift, and the
# test suite (unit, integration against real Prometheus/promtool/Alertmanager; CUDA tests skip
# with a reason when there is no GPU). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
clock() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
[[ $# -gt 0 ]] && export MEMEXPORTER_TEST_TORCH_VERSIONS="${MEMEXPORTER_TEST_TORCH_VERSIONS:-none}"
# One of the other torch versions (scripts/torch_versions.py, the one marked early) runs its tests
# beside the set-up, where its cached venv is current: pip's one process leaves a core idle for most
# of the set-up's minute. Any Python 3 starts it (it goes on in its venv's Python). Its outcome counts
# with the others' below; pytest waits for it (at nice 19 beside pytest it would starve, its deadlines
# with it).
mkdir -p build/torch-versions
rm -f build/torch-versions/early-*.json build/torch-versions/summary.txt
"${PYTHON:-python3}" scripts/torch_versions.py early &
early=$!
trap 'kill "$early" 2>/dev/null || true' EXIT
MEMEXPORTER_SETUP_COMPILE=0 scripts/setup.sh --test  # the bytecode below, beside lint
VPY="${MEMEXPORTER_VENV:-.venv}/bin/python"
export MEMEXPORTER_REQUIRE_BINARIES=1   # missing binaries fail the run instead of skipping
# Lint beside pytest: ruff, mypy and the generated-file check each use one core, and run before
# pytest they left the other idle for a minute. Their output (build/lint.log) comes after pytest's;
# any failure among them fails the run.
lint() {
  local status=0
  echo "[test] ruff"
  "$VPY" -m ruff format --check memexporter tests benchmarks || status=1
  "$VPY" -m ruff check memexporter tests benchmarks || status=1
  # mypy's cache outlives the clone, as the torch venvs do: a fresh clone re-checks only what changed
  # (its cache validates each module by its source's hash), about a minute less on 2 cores.
  echo "[test] mypy"
  MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/memexporter/mypy}" "$VPY" -m mypy || status=1
  echo "[test] generated files"
  "$VPY" -m memexporter.cli.generate --check || status=1
  return $status
}
mkdir -p build
echo "[test] lint (ruff, mypy, generated files) beside the bytecode and pytest: build/lint.log"
set -m  # lint in a process group of its own, so that stopping it stops mypy and ruff too
lint > build/lint.log 2>&1 &
linting=$!
set +m
trap 'kill "$early" 2>/dev/null; kill -- -"$linting" 2>/dev/null || true' EXIT
# The torch versions users run (the oldest claimed, 2.11, the newest: scripts/torch_versions.py): each
# in its cached venv (set up once, outside the clone). The set-up (a download on a first run, a check
# after) runs beside pytest; the tests run after it, side by side on the two cores (the first has run
# beside the set-up, above, where it could). Beside pytest, even at nice 19, they starved its timing
# tests and were starved in turn (a paced scrape's p99, vmalert's pair test, two gloo ranks past
# 180 s: a load of 12 on 2 cores). Their lines start
# with [torch ...]. MEMEXPORTER_TEST_TORCH_VERSIONS=none skips them, as a run given pytest arguments
# does unless the variable names versions (2.11,2.15 or all).
"$VPY" scripts/torch_versions.py setup --after-early &
versions=$!
trap 'kill "$early" "$versions" 2>/dev/null; kill -- -"$linting" 2>/dev/null || true' EXIT
# The venv's bytecode (set-up left it to here), before pytest, whose six workers would otherwise each
# compile torch at once, and beside lint and the torch versions' check: only what the suite imports
# (scripts/warm_bytecode.py: 3,800 modules in 25 CPU-s on one core, where compileall over
# site-packages took 61 on two for 12,400 files), and the test modules as pytest rewrites them (a
# worker's collection: 16 CPU-s without, 10 with). A module left out is compiled by the process that
# imports it, as without it.
"$VPY" scripts/warm_bytecode.py
waited=$SECONDS
wait "$early" || true  # its outcome is in build/torch-versions/early-*.json (none: it runs below)
echo "[test] the early torch version ended $((SECONDS - waited)) s after the bytecode"
setup_s=$((SECONDS - began))
# Tests run in parallel processes (pytest-xdist). --dist loadgroup keeps each xdist_group (tests
# sharing one expensive fixture) on one worker; --no-loadscope-reorder leaves the order to
# tests/support/schedule.py's plan: the tests that spend minutes waiting on real Prometheus,
# Alertmanager or paced demos on half the workers, the CPU-bound ones on the other half, each
# longest first. Six workers on 2 cores, as the waiting ones use a tenth of a core each: with four
# in file order the cores sat idle 16 % of the run. Slow tests name themselves as they start and
# end (tests/support/progress.py). MEMEXPORTER_TEST_WORKERS=1: serial.
workers="${MEMEXPORTER_TEST_WORKERS:-6}"
echo "[test] pytest ($workers workers)"
pytest_began=$SECONDS
set +e
if [[ "$workers" == "1" ]]; then
  "$VPY" -m pytest -q "$@"
else
  "$VPY" -m pytest -q -n "$workers" --dist loadgroup --no-loadscope-reorder "$@"
fi
rc=$?
pytest_s=$((SECONDS - pytest_began))
# pytest exits 5 when it collected nothing: that is a broken suite, not a pass.
[[ $rc -eq 5 ]] && { echo "[test] pytest collected no tests" >&2; rc=1; }
wait "$versions"  # the set-up: its failure shows in the run's outcome below
wait "$linting"
lint_rc=$?
trap - EXIT
cat build/lint.log
[[ $lint_rc -ne 0 ]] && echo "[test] lint FAILED (above)" >&2
# The venv this set-up built, bytecode and all, for the next clone's set-up, once the suite passed on it
# (scripts/venv_cache.py; nothing when one is there already, or this one was linked from it): about a second.
if [[ $rc -eq 0 && $lint_rc -eq 0 ]]; then "${PYTHON:-python3}" scripts/venv_cache.py save "${MEMEXPORTER_VENV:-.venv}" || true; fi
echo "[test] the other torch versions"
versions_began=$SECONDS
"$VPY" scripts/torch_versions.py run --checked --after-early  # the set-up beside pytest checked the venvs
versions_rc=$?
set -e
[[ -f build/torch-versions/summary.txt ]] && cat build/torch-versions/summary.txt
# The whole command's time, and its parts: the budget is 15 minutes on 2 cores (docs/development.md).
echo "[test] total $(clock $((SECONDS - began))): set-up $(clock "$setup_s"), pytest $(clock "$pytest_s")" \
  "(lint beside it), torch versions $(clock $((SECONDS - versions_began)))"
[[ $rc -ne 0 ]] && exit $rc
[[ $lint_rc -ne 0 ]] && exit $lint_rc
exit $versions_rc
