"""README's "Running the tests", followed literally on a fresh machine (tests/support/fresh.py):
a copy of the checkout, a virtualenv with nothing in it, and the README's two commands,
parsed out of README.md so they cannot drift. Between them, every check CI runs
(tests/support/ci.py, kept equal to .ci/run by tests/unit/test_ci.py), so the README's
editable install (`pip install -e`) is one a contributor can run every CI check from.

Slow (a full `pip install` of the test extra: minutes), so marked `slow`. The nested run of
the test command skips this test, so it never recurses into itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.ci import CI_CHECKS
from support.fresh import activated, clean_environment, copy_checkout, outside_pytest_temp
from support.readme import readme_test_commands

pytestmark = pytest.mark.slow

NESTED = "LEASEQ_FRESH_VENV_NESTED"
# Tests that skip for a tool the setup should have installed say so with this hint (chartkit).
MISSING_TOOL = "scripts/setup-tests.sh"


def _shell(command: str, cwd: Path, env: dict[str, str], **extra: str) -> str:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{output[-4000:]}"
    return output


def test_readme_names_two_commands_install_then_test() -> None:
    commands = readme_test_commands()
    assert len(commands) == 2, commands
    assert commands[1] == "python -m pytest"


def test_the_setup_installs_editable() -> None:
    """The CI checks above run against the checkout's sources (lint-imports, mypy): the
    setup must install it editable, as a contributor does."""
    setup = Path(__file__).resolve().parents[2] / "scripts" / "setup-tests.sh"
    assert "pip install --quiet --editable" in setup.read_text()


@pytest.mark.skipif(os.environ.get(NESTED) == "1", reason="inside the fresh-venv run already")
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the checkout's files")
def test_readme_test_setup_works_in_a_fresh_virtualenv() -> None:
    with outside_pytest_temp("leaseq-fresh-") as folder:
        _setup_and_test(folder)


def _setup_and_test(folder: Path) -> None:
    install, test = readme_test_commands()
    repo = copy_checkout(folder / "repo")
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    env = activated(clean_environment(), venv)
    env[NESTED] = "1"

    _shell(install, repo, env)
    # Each check as .ci/run runs it, in the checkout, with only what the setup installed.
    for check in CI_CHECKS:
        _shell(check, repo, env)
    # The whole suite must collect: a test module importing what the setup did not install
    # (tests/bench and matplotlib, once) stops `python -m pytest` before it runs anything.
    collected = _shell(test, repo, env, PYTEST_ADDOPTS="--collect-only -q")
    assert "error" not in collected.splitlines()[-1], collected[-4000:]
    # A quick part of it for real, including the tests that need the fetched tools.
    ran = _shell(test, repo, env, PYTEST_ADDOPTS="-x -q tests/unit tests/chart")
    missing = [line for line in ran.splitlines() if "SKIPPED" in line and MISSING_TOOL in line]
    assert missing == [], "\n".join(missing)
