#!/usr/bin/env bash
# The main job: set everything up, then train a small GPT with memexporter serving
# http://localhost:9400/metrics. Arguments go to `memexporter demo` (see --help), e.g.
#   scripts/demo.sh --leak-mib-per-step 8 --memory-limit-mib 4096
set -euo pipefail
cd "$(dirname "$0")/.."
VPY="${MEMEXPORTER_VENV:-.venv}/bin/python"

for arg in "$@"; do
  if [[ "$arg" == "-h" || "$arg" == "--help" ]]; then
    # Help needs no set-up: from the environment when it is there, else say what the first run does.
    [[ -x "$VPY" ]] && "$VPY" -m memexporter demo --help 2>/dev/null && exit 0
    cat <<'TXT'
usage: scripts/demo.sh [memexporter demo options]

Sets up a virtual environment in .venv (the package, and a CPU build of torch when none is
installed; a couple of minutes the first time, a quick check afterwards), then trains a small
GPT with memexporter serving http://localhost:9400/metrics until interrupted.

The environment is not set up yet, so the demo's own options cannot be listed. Run
scripts/setup.sh (or scripts/demo.sh once), then scripts/demo.sh --help. Common ones:
  --leak-mib-per-step N   keep N MiB alive per step (a leak)
  --memory-limit-mib M    stop with a simulated OOM when used memory reaches M MiB
  --steps N               steps to train (0: until interrupted)
  --port P                base port (default 9400)
TXT
    exit 0
  fi
done

scripts/setup.sh
exec "$VPY" -m memexporter demo "$@"
