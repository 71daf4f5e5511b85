#!/usr/bin/env bash
# The GPU check, in one command, on a machine with an NVIDIA GPU and no network. It installs nothing:
# it runs the checkout with a Python that already has a CUDA build of torch (python3, or $PYTHON).
# In order, each step run even if an earlier one failed:
#   1. tests/cuda (allocator, retries, NVML, no stray CUDA context, leak and step-peak accuracy, scrape cost)
#   2. the fixture recorder (into tests/fixtures/recorded/: commit them) and the fixture tests on its answers
#   3. the trace replay (tests/support/replay.py) of the committed H200 traces
#   4. new per-step traces through a real OOM under each allocator (native, expandable segments,
#      cudaMallocAsync), with the exporter watching, and their replay
#   4b. a variable-length job (the demo's GPT) through a real OOM on its longest batch: the input capacity
#      the exporter predicted before the long batches, against the lengths that ran and died, and its trace
#   5. the launch-bound benchmark's GPU twin (benchmarks/bench_launch.py --device cuda), where it exists
#   6. the overhead and scrape benchmarks (--device cuda)
# then writes one summary (build/gpu-check/summary.txt) and one tarball of its logs, fixtures and
# traces (build/gpu-check.tar.gz). About 6 minutes on one H100 or H200 (on an H200, 2026-11-27: 110 s of
# CUDA tests, 75 s of traces, then the benchmarks). Exit status 1 if a step failed.
#
#   scripts/gpu-check.sh                   # PYTHON=/path/to/python scripts/gpu-check.sh for another Python
#
# Required in that Python: torch (a CUDA build), prometheus_client, psutil, numpy, yaml, pytest.
# Optional: nvidia-ml-py (without it no device series, and the NVML checks skip with their reason).
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
LOGS="${MEMEXPORTER_GPU_CHECK_DIR:-build/gpu-check}"
say() { printf '\033[1m[gpu-check]\033[0m %s\n' "$*"; }
stop() { printf '[gpu-check] %s\n' "$*" >&2; mkdir -p "$LOGS"; printf 'memexporter GPU check: stopped\n  %s\n' "$*" >"$LOGS/summary.txt"; exit 2; }

command -v "$PY" >/dev/null 2>&1 || stop "no Python at '$PY': set PYTHON to the Python that has your CUDA build of torch"
missing="$("$PY" - <<'EOF' 2>/dev/null
import importlib.util
need = {"torch": "torch", "prometheus_client": "prometheus-client", "psutil": "psutil", "numpy": "numpy",
        "yaml": "pyyaml", "pytest": "pytest"}
print(" ".join(pip for mod, pip in need.items() if importlib.util.find_spec(mod) is None))
EOF
)" || stop "'$PY' does not run Python 3"
[[ -z "$missing" ]] || stop "$PY lacks ${missing// /, }: this check installs nothing (no network); use a Python that has them (PYTHON=...)"
"$PY" -c 'import pynvml' 2>/dev/null || say "no nvidia-ml-py in $PY: no device series; the NVML checks skip with their reason"
torch_line="$("$PY" -c 'import torch; print(f"torch {torch.__version__} (CUDA {torch.version.cuda})")')"
if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  stop "$torch_line sees no CUDA device: stopping before the first step, which needs CUDA (tests/cuda)"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1  # the checkout's memexporter, no install
rm -rf "$LOGS"; mkdir -p "$LOGS"
say "$torch_line, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); logs in $LOGS"

declare -A STATUS=() TOOK=()
STEPS=()
# step NAME LOG SECONDS COMMAND...: run under a deadline, tee to the log, remember the exit status.
step() {
  local name="$1" log="$LOGS/$2" limit="$3"; shift 3
  STEPS+=("$name")
  say "$name  (log: $log, at most ${limit}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
  STATUS[$name]=${PIPESTATUS[0]}
  TOOK[$name]=$((SECONDS - t0))
}

step "cuda tests" cuda-tests.log 150 "$PY" -m pytest tests/cuda -v -rA -s -p no:cacheprovider
step "record fixtures" record.log 40 "$PY" -m tests.cuda.record_fixtures --out tests/fixtures/recorded
step "fixture tests" fixture-tests.log 40 "$PY" -m pytest -q -rs -p no:cacheprovider \
  tests/unit/test_recorded_fixtures.py tests/unit/test_fixture_recorder.py
step "trace replay" replay.log 40 "$PY" -m tests.support.replay
step "record traces" traces.log 120 "$PY" -m tests.cuda.record_traces --out "$LOGS/traces"
step "replay new traces" replay-new.log 30 "$PY" -m tests.support.replay "$LOGS/traces"
step "variable-length OOM" lengths.log 180 "$PY" -m tests.cuda.record_lengths --out "$LOGS/traces"
if grep -q -- '--device' benchmarks/bench_launch.py 2>/dev/null; then
  step "launch-bound benchmark" bench-launch.log 90 "$PY" benchmarks/bench_launch.py --device cuda --rounds 10 --block 0.5 --part start
fi
step "overhead benchmark" bench-overhead.log 45 "$PY" benchmarks/bench_overhead.py --device cuda --rounds 4
step "scrape benchmark" bench-scrape.log 40 "$PY" benchmarks/bench_scrape.py --device cuda --scrapes 100 --seconds 5

# --- One summary, one tarball ---------------------------------------------------------------------
summary="$LOGS/summary.txt"
{
  echo "memexporter GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | sed 's/^/  GPU /'
  echo "  $torch_line, memexporter $("$PY" -c 'import memexporter; print(memexporter.__version__)')"
  echo
  for name in "${STEPS[@]}"; do
    if [[ ${STATUS[$name]} -eq 0 ]]; then s="ok    "; elif [[ ${STATUS[$name]} -eq 124 ]]; then s="TIMEOUT"; else s="FAILED"; fi
    printf '  %-7s %-24s %4ss  (exit %s)\n' "$s" "$name" "${TOOK[$name]}" "${STATUS[$name]}"
  done
  echo
  echo "CUDA tests: $(grep -E '^=+ .* in [0-9.]+s' "$LOGS/cuda-tests.log" | tail -1 | tr -d '=' | sed 's/^ *//')"
  grep -oE '(GPU leak|GPU scrape|primary contexts|cuda forward deltas|NVML).*' "$LOGS/cuda-tests.log" | sed 's/^/  /'
  grep -E '^(FAILED|SKIPPED)' "$LOGS/cuda-tests.log" | sed 's/^/  /'
  echo "Recorded fixtures (commit them):"; grep -E '^\[record\]' "$LOGS/record.log" | sed 's/^/  /'
  echo "Fixture tests: $(tail -1 "$LOGS/fixture-tests.log")"
  echo "Replay of the committed H200 traces:"; grep -E '^\[replay\]' "$LOGS/replay.log" | sed 's/^/  /'
  echo "New traces through a real OOM, the exporter watching:"; grep -E '^\[traces\]' "$LOGS/traces.log" | sed 's/^/  /'
  echo "Their replay:"; grep -E '^\[replay\]' "$LOGS/replay-new.log" | sed 's/^/  /'
  echo "A variable-length job through an OOM on its longest batch:"; grep -E '^\[lengths\]' "$LOGS/lengths.log" | sed 's/^/  /'
  [[ -f "$LOGS/bench-launch.log" ]] && { echo "Launch-bound benchmark on the GPU:"; grep -E 'ratio|median' "$LOGS/bench-launch.log" | sed 's/^/  /'; }
  echo "Step time with memexporter / without (bench_overhead.py --device cuda):"
  grep -E 'ratio|torch ' "$LOGS/bench-overhead.log" | sed 's/^/  /'
  echo "Scrape cost (bench_scrape.py --device cuda):"; grep -E 'us|tracked modules|scrapers' "$LOGS/bench-scrape.log" | sed 's/^/  /'
} 2>/dev/null | tee "$summary"
cp tests/fixtures/recorded/*.json "$LOGS/" 2>/dev/null
tar -czf "$LOGS.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
say "summary: $summary; everything: $LOGS.tar.gz"

for name in "${STEPS[@]}"; do
  [[ ${STATUS[$name]} -eq 0 ]] || exit 1
done
