"""README's "Running the tests", followed literally on a fresh machine: a copy of the checkout
(the files git tracks or would track, so no build/, .tools/ or egg-info), a virtualenv with
nothing in it, and the README's two commands, parsed out of README.md so they cannot drift.

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

from support.readme import readme_test_commands

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NESTED = "LEASEQ_FRESH_VENV_NESTED"
# Tests that skip for a tool the setup should have fetched say so with this hint (chartkit).
MISSING_TOOL = "scripts/fetch-tools.sh"


def _fresh_checkout(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, dest = ROOT / name, target / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in git
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, dest)
    return target


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


@pytest.mark.skipif(os.environ.get(NESTED) == "1", reason="inside the fresh-venv run already")
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the checkout's files")
def test_readme_test_setup_works_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    install, test = readme_test_commands()
    repo = _fresh_checkout(tmp_path / "repo")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    # What `. venv/bin/activate` does, for a shell that is not interactive.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LEASEQ_TOOLS_DIR")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
    env[NESTED] = "1"

    _shell(install, repo, env)
    # The whole suite must collect: a test module importing what the setup did not install
    # (tests/bench and matplotlib, once) stops `python -m pytest` before it runs anything.
    collected = _shell(test, repo, env, PYTEST_ADDOPTS="--collect-only -q")
    assert "error" not in collected.splitlines()[-1], collected[-4000:]
    # A quick part of it for real, including the tests that need the fetched tools.
    ran = _shell(test, repo, env, PYTEST_ADDOPTS="-x -q tests/unit tests/chart")
    missing = [line for line in ran.splitlines() if "SKIPPED" in line and MISSING_TOOL in line]
    assert missing == [], "\n".join(missing)
