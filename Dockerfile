# syntax=docker/dockerfile:1
# One image for every process of the product: the console (ASGI), the Celery workers and
# the serving workers; compose and the Kubernetes manifests pick the command.
#
#   docker build -t modelops .                 # CPU (the default, last stage)
#   docker build --target cuda -t modelops:cuda .   # NVIDIA GPU: CUDA 12 runtime + cuDNN 9
#
# Base images are pinned to exact tags; the Python matches the project's (3.11).

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------- build: the venv
# Runtime requirements only (requirements.txt): the test and audit tools never ship.
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt

# ---------------------------------------------------------------- code: what runs
# Only what the processes read at run time (templates and static files included);
# registry/building makes the demo models, tests and tools stay out.
FROM scratch AS code
COPY manage.py /app/manage.py
COPY console /app/console
COPY serving /app/serving
COPY registry /app/registry
COPY templates /app/templates
COPY static /app/static

# ---------------------------------------------------------------- cuda
# onnxruntime-gpu (pinned in requirements.txt) loads CUDA and cuDNN from the system; on
# a host without a GPU it falls back to the CPU. Python comes from the build stage (same
# interpreter as the venv); Ubuntu 24.04's glibc is newer than bookworm's, so it runs.
FROM ${CUDA_IMAGE} AS cuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates util-linux coreutils \
       libssl3t64 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g libexpat1 libuuid1 libncursesw6 libreadline8t64 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin /usr/local/bin
COPY --from=build /usr/local/lib /usr/local/lib
COPY --from=build /opt/venv /opt/venv
COPY --from=code /app /app
# A fixed, unprivileged uid: the processes that load uploaded models own nothing of the code.
RUN ldconfig \
    && groupadd --system --gid 10001 modelops \
    && useradd --system --uid 10001 --gid modelops --no-create-home --home-dir /data modelops \
    && mkdir -p /data && chown modelops:modelops /data \
    && command -v setpriv && command -v prlimit && command -v nice
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DATA_DIR=/data
RUN python -c "import ssl, sqlite3, onnxruntime"
WORKDIR /app
USER 10001:10001
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["python", "-m", "uvicorn", "console.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--http", "console.http_protocol:HeadTimedH11Protocol", "--h11-max-incomplete-event-size", "65536", "--no-proxy-headers", "--lifespan", "off", "--ws-max-size", "4096"]

# ---------------------------------------------------------------- runtime (default): CPU
FROM ${PYTHON_IMAGE} AS runtime
# setpriv and prlimit (util-linux) and nice (coreutils) confine the children that open
# uploaded models (registry/jobs/child.py, registry/artifacts/inspection.py): without them
# a job's child would run without its memory limit and outlive a killed Celery worker.
RUN apt-get update \
    && apt-get install -y --no-install-recommends util-linux coreutils \
    && rm -rf /var/lib/apt/lists/* \
    && command -v setpriv && command -v prlimit && command -v nice
COPY --from=build /opt/venv /opt/venv
COPY --from=code /app /app
RUN groupadd --system --gid 10001 modelops \
    && useradd --system --uid 10001 --gid modelops --no-create-home --home-dir /data modelops \
    && mkdir -p /data && chown modelops:modelops /data
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DATA_DIR=/data
WORKDIR /app
USER 10001:10001
EXPOSE 8000 8001
# The console's liveness; compose gives the other processes their own probe.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["python", "-m", "uvicorn", "console.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--http", "console.http_protocol:HeadTimedH11Protocol", "--h11-max-incomplete-event-size", "65536", "--no-proxy-headers", "--lifespan", "off", "--ws-max-size", "4096"]
