# syntax=docker/dockerfile:1
# One image for both roles: `leaseq worker ...` and `leaseq operator ...` (ENTRYPOINT is
# `leaseq`, the chart passes the subcommand). Build: docker build -t leaseq:dev .
# Both stages use the same interpreter: the venv built in the first runs in the second.
ARG PYTHON_VERSION=3.12

# --- builder: build the wheel and install it with its dependencies into a venv -----------
FROM python:${PYTHON_VERSION}-slim-bookworm AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# README* matches nothing on a tree without a README; pyproject.toml keeps the COPY valid.
COPY pyproject.toml README* ./
COPY worker ./worker
COPY operator ./operator
COPY sql ./sql
# The runtime venv keeps no pip: it is not needed to run, and is one less thing to patch.
# The image serves every role, so it carries the operator extra (kopf, the Kubernetes client)
# and the console extra (Starlette, Jinja2, uvicorn: `leaseq console`), and the otel extra
# (the OpenTelemetry SDK and OTLP exporter: tracing is turned on by OTEL_* variables alone).
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/leaseq \
    && wheel=$(ls /wheels/leaseq-*.whl) \
    && /opt/leaseq/bin/pip install "${wheel}[operator,console,otel]" \
    && /opt/leaseq/bin/pip uninstall --yes pip

# --- ocr-builder: the builder's venv plus the OCR example's extra (leaseq[ocr]) ----------
# rapidocr requires opencv-python, whose cv2 needs the X11/GL libraries a slim image lacks;
# opencv-python-headless is the same cv2 without them, swapped in at the same version.
FROM builder AS ocr-builder
RUN wheel=$(ls /wheels/leaseq-*.whl) \
    && python -m pip --python /opt/leaseq/bin/python install "${wheel}[ocr]" \
    && cv=$(/opt/leaseq/bin/python -c 'from importlib.metadata import version; print(version("opencv-python"))') \
    && python -m pip --python /opt/leaseq/bin/python uninstall --yes opencv-python \
    && python -m pip --python /opt/leaseq/bin/python install --no-deps "opencv-python-headless==${cv}" \
    && /opt/leaseq/bin/python -c 'import cv2, rapidocr_onnxruntime'

# --- ocr: `docker build --target ocr`: the final image below plus the OCR example ----------
# Runs `leaseq worker --app leaseq.examples.ocr:registry` unless given other arguments. For
# CUDA, install onnxruntime-gpu in place of onnxruntime on a CUDA base (see README).
FROM python:${PYTHON_VERSION}-slim-bookworm AS ocr
LABEL org.opencontainers.image.title="leaseq-ocr" \
      org.opencontainers.image.description="leaseq worker with the OCR example (PP-OCR on onnxruntime)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=ocr-builder /opt/leaseq /opt/leaseq
ENV PATH=/opt/leaseq/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
HEALTHCHECK NONE
ENTRYPOINT ["leaseq"]
CMD ["worker", "--app", "leaseq.examples.ocr:registry"]

# --- final: the interpreter, the venv, a numeric non-root user; no compilers, no pip ------
FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="leaseq" \
      org.opencontainers.image.description="PostgreSQL-backed work queue for slow jobs: worker and operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/leaseq /opt/leaseq
ENV PATH=/opt/leaseq/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Numeric uid:gid so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
WORKDIR /tmp
# Kubernetes probes the roles' own /healthz and /readyz (ports differ per role); a Docker
# HEALTHCHECK would have to guess the role, so none is declared.
HEALTHCHECK NONE
ENTRYPOINT ["leaseq"]
CMD ["--help"]
