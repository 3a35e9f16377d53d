#!/usr/bin/env bash
# mypy (strict, config in pyproject.toml) on an installed copy of the package: the
# package-dir mapping (worker/ -> leaseq) is invisible to mypy in an editable install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=$(mktemp -d)
trap 'rm -rf "$target"' EXIT
python -m pip install --quiet --no-deps --no-build-isolation --target "$target" "$root" 2>/dev/null \
  || python -m pip install --quiet --no-deps --target "$target" "$root"
cd "$target"
MYPYPATH="$target" python -m mypy --config-file "$root/pyproject.toml" -p leaseq
