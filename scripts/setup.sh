#!/usr/bin/env bash
# Set-up shared by scripts/demo.sh and scripts/test.sh, for a fresh Debian/Ubuntu machine with
# Python 3.10+. Idempotent: a second run only checks (a stamp in the venv records pyproject.toml's
# hash and the extras installed; pip runs again only when they change).
#   scripts/setup.sh            venv + package (+ a CPU build of torch when torch is missing)
#   scripts/setup.sh --test     also the dev tools and Debian's prometheus, prometheus-alertmanager,
#                               victoria-metrics (VictoriaMetrics single-node and vmalert: the
#                               long-term-store test), docker-compose (the compose file's schema check)
#                               and chromium with chromium-driver (the live page in a browser)
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1
case "${1:-}" in
  ""|--test) ;;
  *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac
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

restored=0 created=0
if [[ ! -x "$VENV/bin/python" ]]; then
  # The test command's venv, as an earlier clone's test command left it (scripts/venv_cache.py: the same
  # checkout, built at most a week ago), linked in: 6.5 CPU-s where building it takes 46.
  if [[ $want_test -eq 1 ]] && "$PY" scripts/venv_cache.py restore "$VENV"; then
    restored=1
  else
    created=1
    say "creating virtual environment $VENV"
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
      rm -rf "$VENV"
      apt_install python3-venv
      "$PY" -m venv "$VENV"
    fi
  fi
fi
VPY="$VENV/bin/python"
# setuptools warns "Editable installation ... be careful with folders in your working directory"
# on every editable install, which reads like a failure to a first-time user; nothing is wrong.
editable() { PYTHONWARNINGS="ignore:Editable installation" "$VPY" -m pip install -q --no-compile "$@"; }
STAMP="$VENV/.memexporter-setup"
BUILT="$VENV/.memexporter-built"  # built from nothing by this script, at that time: scripts/venv_cache.py keeps only such a venv
extras=""
[[ $want_test -eq 1 ]] && extras="[dev]"
# What the editable install depends on: pyproject.toml, the extras, and where the checkout is.
# A stamp written after a [dev] install also serves a plain one.
hash="$(sha256sum pyproject.toml | cut -c1-16)"
{ read -r have_hash have_extras have_path < "$STAMP"; } 2>/dev/null || true  # no stamp yet: a first install
installed=0
if [[ "${have_hash:-}" == "$hash" && "${have_path:-}" == "$(pwd)" && ( "${have_extras:-}" == "[dev]" || -z "$extras" ) ]]; then
  installed=1
fi
if [[ $restored -eq 1 ]]; then
  # Everything but memexporter came with the cached venv: install it alone, with the venv's setuptools
  # (no isolated build environment to set up: 1.5 CPU-s where that takes 4), or isolated if that fails.
  say "installing memexporter$extras (editable; its dependencies came with the cached venv)"
  editable --no-deps --no-build-isolation -e . 2>/dev/null || editable --no-deps -e .
  echo "$hash ${extras:-[]} $(pwd)" > "$STAMP"
  installed=2  # installed, and said so
fi
[[ $installed -ne 0 ]] || "$VPY" -m pip install -q --upgrade pip >/dev/null

# torch: keep the one that is there (a user's CUDA build must survive); otherwise a CPU build.
# A plain `pip install torch` from PyPI pulls the CUDA build and several GB of nvidia-* wheels, so
# ask for the +cpu local version, which only PyTorch's CPU index (or a local wheel cache) has;
# dependencies still come from PyPI. Where neither serves it, fall back to PyPI's build.
if [[ $installed -eq 0 ]] && ! "$VPY" -c 'import torch' 2>/dev/null; then
  say "installing torch==$TORCH_VERSION (CPU build)"
  "$VPY" -m pip install -q --no-compile --extra-index-url "${MEMEXPORTER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" \
      --timeout 15 --retries 1 "torch==$TORCH_VERSION+cpu" 2> >(grep -v -e 'Retrying' -e 'Location' >&2) \
    || { say "no CPU build of torch $TORCH_VERSION found; installing PyPI's (large)"; "$VPY" -m pip install -q --no-compile "torch==$TORCH_VERSION"; }
  # Where the caller compiles (MEMEXPORTER_SETUP_COMPILE=0: the test command), torch's own bytecode is
  # written here, on the core that the next pip install (one process) leaves idle: about 10 CPU-s that
  # the caller's compile step would otherwise spend before its tests start.
  if [[ "${MEMEXPORTER_SETUP_COMPILE:-1}" == "0" ]]; then
    "$VPY" -c 'import sys; sys.dont_write_bytecode = False; import torch' >/dev/null 2>&1 &
    torch_bytecode=$!
  fi
fi

if [[ $installed -eq 1 ]]; then
  say "memexporter$extras already installed (pyproject.toml unchanged)"
elif [[ $installed -eq 0 ]]; then
  say "installing memexporter$extras (editable)"
  rm -f "$STAMP" "$BUILT"  # a venv updated in place is this clone's alone (leftovers of an earlier pyproject.toml)
  editable -e ".$extras"
  # The bytecode, on every core: pip compiles one file at a time (30 of torch's 43 s here), compileall
  # -j 0 the whole venv in about 5 s. A file that does not compile is skipped, as pip skips it.
  # MEMEXPORTER_SETUP_COMPILE=0 leaves it to the caller: the test command compiles beside its lint.
  if [[ "${MEMEXPORTER_SETUP_COMPILE:-1}" != "0" ]]; then
    "$VPY" -m compileall -q -j 0 "$("$VPY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null 2>&1 || true
  fi
  echo "$hash ${extras:-[]} $(pwd)" > "$STAMP"
  if [[ $created -eq 1 ]]; then date +%s > "$BUILT"; fi
fi

if [[ $want_test -eq 1 ]]; then
  missing=()
  command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
  command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null || missing+=(prometheus-alertmanager)
  command -v victoria-metrics >/dev/null && command -v vmalert >/dev/null || missing+=(victoria-metrics)
  # Compose v1 validates deploy/compose/compose.yaml against the compose schema, with no engine.
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  # The live page's browser test: headless chromium, driven by Selenium through Debian's chromedriver.
  command -v chromium >/dev/null || missing+=(chromium)
  command -v chromedriver >/dev/null || missing+=(chromium-driver)
  if [[ ${#missing[@]} -gt 0 ]]; then apt_install "${missing[@]}"; fi
  # Debian's victoria-metrics binaries print an empty -version; dpkg knows the package's.
  vm_version="$(dpkg-query -W -f='${Version}' victoria-metrics 2>/dev/null || echo unknown)"
  say "prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}'), alertmanager $(prometheus-alertmanager --version 2>&1 | head -1 | awk '{print $3}'), victoria-metrics ${vm_version%%+*}"
fi
[[ -n "${torch_bytecode:-}" ]] && { wait "$torch_bytecode" || true; }
ready() { "$VPY" -c 'import torch, memexporter; print(f"memexporter {memexporter.__version__}, torch {torch.__version__}")'; }
if ! versions="$(ready 2>/dev/null)"; then
  # The stamp said all is installed, but the environment does not import (a package removed by
  # hand, say): forget the stamp and set up again, once.
  [[ -n "${MEMEXPORTER_SETUP_RETRY:-}" ]] && { ready; exit 1; }
  say "the environment does not import; setting it up again"
  rm -f "$STAMP"
  # A venv linked from the cache is built again from nothing (pip would find its damaged packages
  # "already satisfied"), and the entry is dropped: this build takes its place.
  if [[ $restored -eq 1 ]]; then "$PY" scripts/venv_cache.py forget; rm -rf "$VENV"; fi
  MEMEXPORTER_SETUP_RETRY=1 exec "$0" "$@"
fi
say "ready: $versions"
