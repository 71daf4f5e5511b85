# memexporter's demo job, and a base for your own: `memexporter run train.py` wraps any entry point.
#   docker build -t memexporter .                  # CPU: python:3.11-slim + torch's CPU build
#   docker run --rm -p 9400:9400 memexporter       # the demo; add --gpus all on a CUDA image
# On GPUs, start from a CUDA PyTorch image: its torch (a CUDA build) is kept, never replaced:
#   docker build --build-arg BASE=pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime -t memexporter:cuda .
# Any base works that has `python` with pip; torch must be at least memexporter's minimum (see README).
# Lint: hadolint Dockerfile (tests/integration/test_image.py runs it).
ARG BASE=python:3.11-slim
FROM ${BASE}

# Declared again: an ARG before FROM is not visible after it (the label below records the base).
ARG BASE
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG VERSION=0.2.0
ARG UID=10001
LABEL org.opencontainers.image.title="memexporter" \
      org.opencontainers.image.description="PyTorch training memory on a Prometheus /metrics endpoint: the memexporter demo job" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/memexporter/memexporter" \
      org.opencontainers.image.documentation="https://github.com/memexporter/memexporter#deploy" \
      org.opencontainers.image.base.name="${BASE}"

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MEMEXPORTER_PORT=9400

# torch first, in its own layer: it is the large one, and a change to memexporter must not
# reinstall it. A base whose torch imports keeps it; otherwise the CPU build is installed, and a
# failed install fails the build (no fallback: an image without torch would only fail at run time).
RUN if python -c "import torch" 2>/dev/null; then \
        echo "keeping the base image's torch"; \
    else \
        pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"; \
    fi \
 && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

WORKDIR /opt/memexporter
COPY pyproject.toml README.md LICENSE ./
COPY memexporter ./memexporter
# The package from this checkout, with NVML for the device metrics. Its own check of torch's
# version runs at the end, so an old torch in the base fails here, with the reason.
# DL3013 (pin versions in pip) does not apply: "." is this checkout, and its dependencies carry
# lower bounds in pyproject.toml, as a library's must (pins would fight the training job's own).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[nvml]" \
 && python -c "from memexporter.backends.torchcheck import require_torch; print('torch', require_torch(), 'is supported')"

# A numeric non-root user: the exporter needs no privileges, and Kubernetes' runAsNonRoot can
# only verify a numeric USER.
RUN groupadd --gid "${UID}" trainer \
 && useradd --uid "${UID}" --gid "${UID}" --create-home --home-dir /home/trainer --shell /usr/sbin/nologin trainer
USER ${UID}:${UID}
WORKDIR /home/trainer

EXPOSE 9400
# The job runs as PID 1, where the kernel ignores SIGTERM unless a handler is installed: Python
# has none, so `docker stop` would wait 10 s and kill. SIGINT is KeyboardInterrupt, which training
# loops (and the demo) handle: the exporter stops and the job exits cleanly.
STOPSIGNAL SIGINT
# Probes local rank 0's /healthz where MEMEXPORTER_PORT/ADDR/CERTFILE say it serves (set the port
# through MEMEXPORTER_PORT rather than --port, so the check follows it).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "memexporter.healthcheck"]
ENTRYPOINT ["memexporter"]
CMD ["demo", "--device", "auto"]
