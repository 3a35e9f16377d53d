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
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/leaseq \
    && /opt/leaseq/bin/pip install /wheels/leaseq-*.whl \
    && /opt/leaseq/bin/pip uninstall --yes pip

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
