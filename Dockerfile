# The demo job in a container: `docker build -t memexporter . && docker run -p 9400:9400 memexporter`
# For your own job, install memexporter into your training image instead (pip install .) and
# call memexporter.start(), or wrap the entry point: `memexporter run train.py`.
# BASE can be a CUDA image with torch already installed (e.g. a pytorch/pytorch tag); the
# CPU build of torch is installed only when the base has none.
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TORCH_VERSION=2.13.0
WORKDIR /opt/memexporter
COPY pyproject.toml README.md ./
COPY memexporter ./memexporter
RUN python -c "import torch" 2>/dev/null \
    || pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu; \
    pip install --no-cache-dir ".[nvml]"
EXPOSE 9400
# A non-root user: the exporter needs no privileges.
RUN useradd --create-home trainer
USER trainer
ENTRYPOINT ["memexporter"]
CMD ["demo", "--device", "auto"]
