#!/usr/bin/env bash
# The main job: set everything up, then train a small GPT with memexporter serving
# http://localhost:9400/metrics. Arguments go to `memexporter demo` (see --help), e.g.
#   scripts/demo.sh --leak-mib-per-step 8 --memory-limit-mib 4096
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${MEMEXPORTER_VENV:-.venv}/bin/python" -m memexporter demo "$@"
