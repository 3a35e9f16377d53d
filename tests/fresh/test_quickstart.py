"""README's quickstart, run as written on a fresh machine (tests/support/fresh.py) against a
new, empty database of the test PostgreSQL: from `python3 -m venv` and `pip install .` to the
handler running in `leaseq worker`, then the commands that look at what happened.

Slow (a `pip install .` into a new virtualenv), so marked `slow`."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

import leaseq
from support.fresh import activated, clean_environment, copy_checkout
from support.polling import wait_for
from support.readme import sh_blocks

pytestmark = pytest.mark.slow

HEADING = "## Quickstart"
EXAMPLE_URL = "postgresql://user:pass@localhost:5432/app"


def _greeted(url: str) -> bool:
    try:
        with leaseq.connect(url, action="test") as conn:
            # No query on leaseq's tables before the last migration has committed: a read
            # that locks one table between a migration's locks on two can deadlock with it
            # (seen once: "migrate was rolled back to break a conflict: deadlock detected").
            leaseq.check_schema(conn)
            jobs = leaseq.Queue(conn).jobs(queue="hello")
    except leaseq.LeaseqError:
        return False  # not migrated yet
    return [(j.job_type, j.status) for j in jobs] == [("greet", leaseq.JobStatus.SUCCEEDED)]


def _no_workers(url: str) -> bool:
    with leaseq.connect(url, action="test") as conn:
        return leaseq.Workers(conn).list() == []


def test_quickstart_runs_a_handler_against_your_database(
    empty_database_url: str, tmp_path: Path
) -> None:
    setup, look = sh_blocks(HEADING)
    assert EXAMPLE_URL in setup and setup.rstrip().splitlines()[-1].startswith("leaseq worker")
    repo = copy_checkout(tmp_path / "repo")
    # A shared machine: the worker's default metrics port may be taken by another test run.
    env = {**clean_environment(), "LEASEQ_METRICS_PORT": "0"}
    log = tmp_path / "terminal.log"
    with log.open("w") as out:
        terminal = subprocess.Popen(
            ["bash", "-e", "-c", setup.replace(EXAMPLE_URL, shlex.quote(empty_database_url))],
            cwd=repo,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: _greeted(empty_database_url) or terminal.poll() is not None,
            "the quickstart's job succeeded",
            timeout=1800,
        )
        assert terminal.poll() is None, log.read_text()[-4000:]
    finally:
        os.killpg(terminal.pid, signal.SIGTERM)  # Ctrl-C's cousin: the worker drains and exits
        terminal.wait(timeout=120)
    wait_for(lambda: _no_workers(empty_database_url), "the worker stopped and deregistered")
    assert "hello, world" in log.read_text().splitlines()

    other_terminal = {
        **activated(env, repo / ".venv"),
        "LEASEQ_DATABASE_URL": empty_database_url,
    }
    outputs = []
    for command in filter(None, (line.strip() for line in look.splitlines())):
        done = subprocess.run(
            ["bash", "-c", command], cwd=repo, env=other_terminal, capture_output=True, text=True
        )
        assert done.returncode == 0, f"`{command}`: {done.stderr}"
        outputs.append(done.stdout)
    assert "greet" in outputs[0] and "succeeded" in outputs[0]
