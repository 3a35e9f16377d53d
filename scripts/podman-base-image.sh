#!/usr/bin/env bash
# Build a stand-in for docker.io/library/python:3.11-slim-bookworm from Debian packages, for
# machines where no container registry can be reached (tests/image uses it; users keep the
# real base). Does nothing when the image is already in podman's store, so CI builds it once
# per machine. Needs: podman, runc, mmdebstrap, uidmap (apt). Takes about a minute.
set -euo pipefail
TAG=${LEASEQ_BASE_IMAGE:-docker.io/library/python:3.11-slim-bookworm}
podman=(podman --runtime runc --cgroup-manager cgroupfs)
if "${podman[@]}" image exists "$TAG"; then
  echo "base image $TAG: present"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-venv,python3-pip,ca-certificates bookworm "$work/base.tar"
"${podman[@]}" import "$work/base.tar" localhost/leaseq-debian-python:3.11
# The host's CA bundle: outbound TLS here may be re-signed by a local CA, which pip inside
# the build must trust. python3 as /usr/local/bin/python, where the official image has it.
cp /etc/ssl/certs/ca-certificates.crt "$work/ca-certificates.crt"
cat > "$work/Containerfile" <<'CF'
FROM localhost/leaseq-debian-python:3.11
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN ln -s /usr/bin/python3 /usr/local/bin/python && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
CF
"${podman[@]}" build --network host -t "$TAG" "$work"
echo "base image $TAG: built"
