#!/usr/bin/env bash
# The test setup, first of README.md's two commands under "Running the tests" (the second is
# `python -m pytest`). Run it in a virtualenv: it installs leaseq with everything the tests
# import (the `test` extra) into the `python` on PATH, then the command-line tools some tests
# run (scripts/fetch-tools.sh: helm and kubectl into .tools/bin, where the tests look for
# them; promtool, pgbouncer, podman and friends from Debian). A tool that cannot be installed
# is reported here, and the tests that need it skip with the reason.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v python >/dev/null 2>&1; then
    echo "setup-tests: no \`python\` on PATH; make and activate a virtualenv first:" >&2
    echo "  python3 -m venv .venv && . .venv/bin/activate" >&2
    exit 1
fi
# A venv's own pip is the one its Python shipped with (23.2 with 3.11); an install that
# builds leaseq (pyproject.toml asks setuptools >= 77 for its SPDX license) needs the build
# isolation of a current pip: with 23.2 the venv's old setuptools leaks into the build.
echo "setup-tests: upgrading pip in $(command -v python)"
python -m pip install --quiet --upgrade pip
echo "setup-tests: pip install -e '$repo[test]' into $(command -v python)"
python -m pip install --quiet --editable "$repo[test]"
PYTHON=python "$repo/scripts/fetch-tools.sh"
