#!/usr/bin/env bash
# The first run on a GPU machine, in one command:
#   1. the CUDA tests (tests/cuda: allocator, retries, NVML, no stray CUDA context, leak and
#      step-peak accuracy, scrape cost, the fixture recorder),
#   2. records torch.cuda and NVML answers into tests/fixtures/recorded/ (commit them) and runs
#      the fixture tests on them,
#   3. the overhead and scrape benchmarks with --device cuda,
# then prints one summary. Every step runs even if an earlier one fails; the exit status is 1 if
# any failed. Logs go to build/gpu-check/ (MEMEXPORTER_GPU_CHECK_DIR).
#
#   scripts/gpu-check.sh            # about 10 minutes on one GPU
#   scripts/gpu-check.sh --quick    # shorter benchmarks
#
# Needs an NVIDIA driver and Python 3.10+. torch must be a CUDA build: an existing one in the
# venv is kept; otherwise PyPI's torch is installed (its Linux x86_64 wheels are CUDA builds).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${MEMEXPORTER_VENV:-.venv}"
VPY="$VENV/bin/python"
TORCH_VERSION="${MEMEXPORTER_TORCH_VERSION:-2.13.0}"
LOGS="${MEMEXPORTER_GPU_CHECK_DIR:-build/gpu-check}"
ROUNDS=20
SCRAPES=300
if [[ "${1:-}" == "--quick" ]]; then ROUNDS=6; SCRAPES=100; elif [[ -n "${1:-}" ]]; then
  echo "usage: scripts/gpu-check.sh [--quick]" >&2; exit 2; fi

say() { printf '\033[1m[gpu-check]\033[0m %s\n' "$*"; }
die() { printf '[gpu-check] %s\n' "$*" >&2; exit 1; }

command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this needs a machine with an NVIDIA GPU and its driver"
nvidia-smi -L >/dev/null 2>&1 || die "nvidia-smi sees no GPU: $(nvidia-smi -L 2>&1 | head -1)"

# A CUDA build of torch before scripts/setup.sh, which keeps an existing torch but would put a
# CPU build into a fresh venv. "torch==X" alone is satisfied by an installed X+cpu, hence the
# forced reinstall from PyPI.
if [[ ! -x "$VPY" ]]; then
  python3 -m venv "$VENV" || die "cannot create $VENV (apt-get install python3-venv)"
fi
if ! "$VPY" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
  say "installing torch==$TORCH_VERSION, a CUDA build from PyPI (several GB)"
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q --force-reinstall --index-url https://pypi.org/simple "torch==$TORCH_VERSION"
fi
MEMEXPORTER_VENV="$VENV" scripts/setup.sh
say "installing the test tools (memexporter[dev], with nvidia-ml-py)"
"$VPY" -m pip install -q -e ".[dev]"
"$VPY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' \
  || die "torch $("$VPY" -c 'import torch; print(torch.__version__)') sees no CUDA device (driver too old for its CUDA $("$VPY" -c 'import torch; print(torch.version.cuda)')?)"

mkdir -p "$LOGS"
declare -A STATUS=()
STEPS=()

# step NAME LOG COMMAND...: run, tee to the log, remember the exit status, never stop the script.
step() {
  local name="$1" log="$LOGS/$2"; shift 2
  STEPS+=("$name")
  say "$name  (log: $log)"
  set +e
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  STATUS[$name]=$rc
}

step "cuda tests" cuda-tests.log "$VPY" -m pytest tests/cuda -v -rA -s -p no:cacheprovider
step "record fixtures" record.log "$VPY" -m tests.cuda.record_fixtures --out tests/fixtures/recorded
step "fixture tests" fixture-tests.log "$VPY" -m pytest -q -rs -p no:cacheprovider \
  tests/unit/test_recorded_fixtures.py tests/unit/test_fixture_recorder.py
step "overhead benchmark" bench-overhead.log "$VPY" benchmarks/bench_overhead.py --device cuda --rounds "$ROUNDS"
step "scrape benchmark" bench-scrape.log "$VPY" benchmarks/bench_scrape.py --device cuda --scrapes "$SCRAPES"

# --- One summary ---------------------------------------------------------------------------------
summary="$LOGS/summary.txt"
{
  echo "memexporter GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | sed 's/^/  GPU /'
  "$VPY" -c 'import torch, memexporter; print(f"  torch {torch.__version__} (CUDA {torch.version.cuda}), memexporter {memexporter.__version__}")'
  echo
  for name in "${STEPS[@]}"; do
    if [[ ${STATUS[$name]} -eq 0 ]]; then echo "  ok      $name"; else echo "  FAILED  $name (exit ${STATUS[$name]})"; fi
  done
  echo
  echo "CUDA tests:  $(grep -E '^=+ .* in [0-9.]+s' "$LOGS/cuda-tests.log" | tail -1 | tr -d '=' | sed 's/^ *//')"
  # -s prints each test's own figures next to its name under -v: pick the figures out of the line.
  grep -oE '(GPU leak|GPU scrape|primary contexts|cuda forward deltas).*' "$LOGS/cuda-tests.log" | sed 's/^/  /' || true
  grep -E '^SKIPPED' "$LOGS/cuda-tests.log" | sed 's/^/  /' || true
  echo "Recorded fixtures (commit them):"
  grep -E '^\[record\]' "$LOGS/record.log" | sed 's/^/  /' || true
  echo "Fixture tests: $(tail -1 "$LOGS/fixture-tests.log")"
  echo "Step time with memexporter / without (bench_overhead.py --device cuda):"
  grep -E 'ratio|torch ' "$LOGS/bench-overhead.log" | sed 's/^/  /' || true
  echo "Scrape cost (bench_scrape.py --device cuda):"
  grep -E 'us|tracked modules' "$LOGS/bench-scrape.log" | sed 's/^/  /' || true
} | tee "$summary"
say "summary: $summary"

for name in "${STEPS[@]}"; do
  [[ ${STATUS[$name]} -eq 0 ]] || exit 1
done
