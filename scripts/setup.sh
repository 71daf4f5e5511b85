#!/usr/bin/env bash
# Set-up shared by scripts/demo.sh and scripts/test.sh, for a fresh Debian/Ubuntu machine with
# Python 3.10+. Idempotent: a second run only checks.
#   scripts/setup.sh            venv + package (+ a CPU build of torch when torch is missing)
#   scripts/setup.sh --test     also the dev tools and Debian's prometheus, prometheus-alertmanager
#                               and docker-compose (the compose file's schema check)
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1
VENV="${MEMEXPORTER_VENV:-.venv}"
PY="${PYTHON:-python3}"
TORCH_VERSION="${MEMEXPORTER_TORCH_VERSION:-2.13.0}"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "[setup] need root (or sudo) for: $*" >&2; return 1; fi
}

apt_install() {
  say "installing Debian packages: $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # --no-install-recommends: prometheus recommends node-exporter and its services; we need the binaries.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
  echo "[setup] memexporter needs Python 3.10+, found $("$PY" --version 2>&1)" >&2; exit 1; }

if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating virtual environment $VENV"
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    apt_install python3-venv
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip >/dev/null

# torch: keep the one that is there (a user's CUDA build must survive); otherwise a CPU build.
# A plain `pip install torch` from PyPI pulls the CUDA build and several GB of nvidia-* wheels, so
# ask for the +cpu local version, which only PyTorch's CPU index (or a local wheel cache) has;
# dependencies still come from PyPI. Where neither serves it, fall back to PyPI's build.
if ! "$VPY" -c 'import torch' 2>/dev/null; then
  say "installing torch==$TORCH_VERSION (CPU build)"
  "$VPY" -m pip install -q --extra-index-url "${MEMEXPORTER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" \
      --timeout 15 --retries 1 "torch==$TORCH_VERSION+cpu" 2> >(grep -v -e 'Retrying' -e 'Location' >&2) \
    || { say "no CPU build of torch $TORCH_VERSION found; installing PyPI's (large)"; "$VPY" -m pip install -q "torch==$TORCH_VERSION"; }
fi

extras=""
[[ $want_test -eq 1 ]] && extras="[dev]"
say "installing memexporter$extras (editable)"
"$VPY" -m pip install -q -e ".$extras"

if [[ $want_test -eq 1 ]]; then
  missing=()
  command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
  command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null || missing+=(prometheus-alertmanager)
  # Compose v1 validates deploy/compose/compose.yaml against the compose schema, with no engine.
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  if [[ ${#missing[@]} -gt 0 ]]; then apt_install "${missing[@]}"; fi
  say "prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}'), alertmanager $(prometheus-alertmanager --version 2>&1 | head -1 | awk '{print $3}')"
fi
say "ready: $("$VPY" -c 'import torch, memexporter; print(f"memexporter {memexporter.__version__}, torch {torch.__version__}")')"
