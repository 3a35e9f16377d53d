"""Another language's producer, played by the real psql binary as the producer role: it
enqueues through leaseq.enqueue(...), a real `leaseq worker` (running as the worker role,
with a poll interval far longer than the test) runs the job because of the function's
wake-up, psql reads the outcome through leaseq.job_status(id), and the producer role still
cannot claim, update or delete a job."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

from support.polling import wait_for
from support.roles import Roles, component_roles
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

# Far longer than the test: the idle backoff keeps doubling instead of stopping at a poll.
POLL_SECONDS = 3600.0
IDLE_CLAIMS = 6
IDLE_GAP = 0.5 * 2 ** (IDLE_CLAIMS - 1) / 2  # the 6th idle delay's step is 16 s: at least 8 s


@pytest.fixture
def roles(database_url: str) -> Iterator[Roles]:
    with component_roles(database_url) as made:
        yield made


def psql(url: str, command: str) -> subprocess.CompletedProcess[str]:
    """``psql`` as a script would run it: unaligned tuples only, stop at the first error."""
    binary = shutil.which("psql")
    assert binary, "psql is not installed"
    return subprocess.run(
        [binary, url, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_psql_enqueues_as_the_producer_and_a_worker_runs_it_on_the_wake_up(
    roles: Roles, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    worker = spawn_worker(
        "sql-face", poll=POLL_SECONDS, env={"LEASEQ_DATABASE_URL": roles.urls["worker"]}
    )
    # An idle worker claims again after a backoff that doubles from 0.5 s up to the poll
    # interval, each delay drawn from [step/2, step] (leaseq.core.backoff). After its 6th
    # empty claim the next one is at least IDLE_GAP seconds away, so a job that starts sooner
    # was claimed because of the enqueue's wake-up.
    wait_for(
        lambda: worker.metric("leaseq_claim_latency_seconds_count") >= IDLE_CLAIMS,
        "the worker idling",
    )
    producer = roles.urls["producer"]
    done = psql(
        producer,
        "SELECT id FROM leaseq.enqueue('q', 'work', '{\"seconds\": 0}'::jsonb,"
        " max_attempts => 2, wait => true)",
    )
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.strip())

    def status() -> list[str]:
        out = psql(
            producer,
            f"SELECT status, result, attempts FROM leaseq.job_status({job_id})",
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split("|")

    _, result, attempts = wait_for(lambda: status()[0] == "succeeded" and status())
    assert json.loads(result) == {"worker": "sql-face", "attempt": 1}
    assert attempts == "1"
    waited = psql(
        producer,
        "SELECT extract(epoch FROM started_at - created_at) FROM leaseq.job_view"
        f" WHERE id = {job_id}",
    )
    assert float(waited.stdout) < IDLE_GAP, "the job waited for a poll, not the wake-up"

    bad = psql(producer, "SELECT leaseq.enqueue('no spaces allowed', 'work')")
    assert bad.returncode != 0
    assert "invalid queue: 'no spaces allowed' is not a queue name" in bad.stderr

    for attempt in (
        # What a claim does: take a pending job's lease.
        f"UPDATE leaseq.jobs SET status = 'running', lease_owner = 'me' WHERE id = {job_id}",
        f"UPDATE leaseq.jobs SET result = '1' WHERE id = {job_id}",
        f"DELETE FROM leaseq.jobs WHERE id = {job_id}",
        f"UPDATE leaseq.jobs SET notify_done = false, status = 'dead' WHERE id = {job_id}",
    ):
        refused = psql(producer, attempt)
        assert refused.returncode != 0, attempt
        assert "permission denied" in refused.stderr, (attempt, refused.stderr)
