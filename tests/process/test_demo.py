"""`leaseq demo` end to end: it must account for every job and exit 0."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytestmark = [pytest.mark.process, pytest.mark.demo]


def test_demo_runs_and_every_invariant_holds(database_url: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "leaseq.cli", "demo", "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert "all invariants hold" in done.stdout
    assert "FAIL" not in done.stdout
    # A database of the user's own is written to only when named, and said first.
    assert done.stdout.startswith("WRITING TO YOUR DATABASE ")


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short TMPDIR: a server's socket path must stay under the 107 bytes Unix allows."""
    short = Path(tempfile.mkdtemp(prefix="lq-", dir="/tmp"))
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _env(tmp: Path) -> dict[str, str]:
    """This environment without a database URL, temporary files under ``tmp``."""
    env = {k: v for k, v in os.environ.items() if k != "LEASEQ_DATABASE_URL"}
    return {**env, "TMPDIR": str(tmp)}


def _leaseq(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a `leaseq ...` command line as printed, with this interpreter."""
    argv = shlex.split(command)
    assert argv[0] == "leaseq", command
    return subprocess.run(
        [sys.executable, "-m", "leaseq.cli", *argv[1:]],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_embedded_server_leaves_no_directory_behind(tmp: Path) -> None:
    code = "from leaseq.demo.embedded import EmbeddedPostgres as E; E().stop()"
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(tmp), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp.glob("leaseq-pg-*")) == []


def test_demo_keep_leaves_a_database_to_look_at_and_says_how_to_stop_it(tmp: Path) -> None:
    env = _env(tmp)
    done = _leaseq("leaseq demo --keep", env)
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    lines = [line.strip() for line in done.stdout.splitlines()]
    [look] = [line for line in lines if line.startswith("leaseq status --database-url")]
    [listing] = [line for line in lines if line.startswith("leaseq jobs list --queue")]
    [stop] = [line for line in lines if line.startswith("leaseq demo --stop")]
    try:
        status = _leaseq(look, env)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("QUEUE")
        jobs = _leaseq(listing, env)
        assert jobs.returncode == 0, jobs.stderr
        assert jobs.stdout.count("succeeded") == 35
    finally:
        stopped = _leaseq(stop, env)
    assert stopped.returncode == 0, stopped.stderr
    assert list(tmp.glob("leaseq-pg-*")) == []
    assert _leaseq(look, env).returncode == 2  # the server is gone too


def test_demo_without_keep_leaves_no_server_directory_nor_touches_the_exported_database(
    tmp: Path, empty_database_url: str
) -> None:
    # As after the quickstart: LEASEQ_DATABASE_URL exported for the other commands.
    done = _leaseq("leaseq demo", {**_env(tmp), "LEASEQ_DATABASE_URL": empty_database_url})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "leaseq demo --keep" in done.stdout
    assert list(tmp.glob("leaseq-pg-*")) == []
    assert done.stdout.startswith("LEASEQ_DATABASE_URL is set but not used")
    with psycopg.connect(empty_database_url) as conn:
        row = conn.execute("SELECT to_regnamespace('leaseq')").fetchone()
    assert row == (None,), "the demo migrated the exported database"
