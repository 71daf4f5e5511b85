#!/usr/bin/env bash
# Build, without any registry, the two base images that tests/integration/test_image.py builds the
# Dockerfile on (no registry is reachable here, so python:3.11-slim cannot be pulled):
#   localhost/memexporter-test-base:bookworm        Debian bookworm (debootstrap) + python3 + pip:
#                                                   a stand-in for python:3.11-slim, without torch
#   localhost/memexporter-test-base:bookworm-torch  the same + torch's CPU build: a stand-in for a
#                                                   PyTorch base image (--build-arg BASE=pytorch/...)
# Needs root, debootstrap and podman (apt-get install debootstrap podman runc). Takes ~5 minutes
# and ~2.5 GB under $WORK (default /var/tmp/memexporter-test-base); idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK="${WORK:-/var/tmp/memexporter-test-base}"
IMAGE=localhost/memexporter-test-base
TORCH_VERSION="${MEMEXPORTER_TORCH_VERSION:-2.13.0}"
PY="${MEMEXPORTER_VENV:-.venv}/bin/python"
say() { printf '\033[1m[test-base]\033[0m %s\n' "$*"; }

for tool in debootstrap podman; do
  command -v "$tool" >/dev/null || { echo "[test-base] $tool not found: apt-get install debootstrap podman runc" >&2; exit 1; }
done
mkdir -p "$WORK"

if ! podman image exists "$IMAGE:bookworm"; then
  if [[ ! -x "$WORK/rootfs/usr/bin/python3" ]]; then
    say "debootstrap bookworm into $WORK/rootfs"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log"
  fi
  ln -sf python3 "$WORK/rootfs/usr/bin/python"       # python:3.11-slim has `python`
  # This machine's trust store: where PyPI is reached through a TLS-intercepting proxy, its CA is
  # there, and builds on this base must trust it too (pip reads PIP_CERT, not the system store).
  cp /etc/ssl/certs/ca-certificates.crt "$WORK/rootfs/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
  say "importing $IMAGE:bookworm"
  # PIP_BREAK_SYSTEM_PACKAGES: Debian's python refuses `pip install` outside a venv (PEP 668);
  # python:3.11-slim's does not, and the Dockerfile is written for that.
  tar -C "$WORK/rootfs" -c . | podman import --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' --change 'CMD ["python3"]' - "$IMAGE:bookworm" >/dev/null
fi

if ! podman image exists "$IMAGE:bookworm-torch"; then
  say "downloading torch==$TORCH_VERSION (CPU build) and its dependencies for Python 3.11"
  rm -rf "$WORK/wheels" && mkdir -p "$WORK/wheels"
  "$PY" -m pip download -q -d "$WORK/wheels" --only-binary=:all: --python-version 3.11 --retries 0 --timeout 20 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
    --extra-index-url "${MEMEXPORTER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" "torch==$TORCH_VERSION+cpu"
  say "installing torch into a copy of the base"
  rm -rf "$WORK/rootfs-torch" && cp -a "$WORK/rootfs" "$WORK/rootfs-torch"
  cp -r "$WORK/wheels" "$WORK/rootfs-torch/tmp/wheels"
  chroot "$WORK/rootfs-torch" env PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-cache-dir \
    --no-index --find-links /tmp/wheels "torch==$TORCH_VERSION+cpu"
  rm -rf "$WORK/rootfs-torch/tmp/wheels"
  say "importing $IMAGE:bookworm-torch"
  tar -C "$WORK/rootfs-torch" -c . | podman import --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' --change 'CMD ["python3"]' - "$IMAGE:bookworm-torch" >/dev/null
  rm -rf "$WORK/rootfs-torch"
fi
say "ready: $(podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$IMAGE" | tr '\n' ' ')"
