"""Bad input gets an error naming the problem, and nothing is written."""

from __future__ import annotations

from datetime import datetime

import pytest

import leaseq
from leaseq.core.models import Lease

BAD_JOBS = [
    ({"queue": ""}, "queue", "must not be empty"),
    ({"queue": "x" * 129}, "queue", "limit is 128"),
    ({"job_type": "  "}, "job_type", "must not be empty"),
    ({"job_type": 7}, "job_type", "must be a string"),
    ({"payload": object()}, "payload", "not JSON-serialisable"),
    ({"payload": {"score": float("inf")}}, "payload", "not JSON-serialisable"),
    ({"payload": "x" * 2_000_000}, "payload", "limit is 1048576"),
    ({"delay": -1}, "delay", "must not be negative"),
    ({"max_attempts": 0}, "max_attempts", "at least 1"),
    ({"priority": 40000}, "priority", "must be an integer in"),
    ({"timeout": 0}, "timeout", "greater than zero"),
    ({"run_at": datetime(2030, 1, 1)}, "run_at", "timezone-aware"),
    ({"dedup_key": ""}, "dedup_key", "non-empty"),
]


@pytest.mark.parametrize(("override", "field", "problem"), BAD_JOBS)
def test_bad_job_is_refused_naming_the_field(
    queue: leaseq.Queue, override: dict[str, object], field: str, problem: str
) -> None:
    args: dict[str, object] = {"queue": "q", "job_type": "t", "payload": {}, **override}
    with pytest.raises(leaseq.InvalidJob) as caught:
        queue.enqueue(**args)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert problem in str(caught.value)
    assert "nothing was written" in str(caught.value)
    assert queue.stats() == []


def test_unknown_job_ids_are_reported(queue: leaseq.Queue) -> None:
    with pytest.raises(leaseq.JobNotFound, match="job 424242 does not exist"):
        queue.get(424242)
    with pytest.raises(leaseq.JobNotFound):
        queue.retry_dead(424242)
    ghost = Lease(424242, "w", 1, 1, datetime.now().astimezone(), b"")
    with pytest.raises(leaseq.JobNotFound):
        queue.complete(ghost)


def test_unreachable_database_names_host_port_and_that_nothing_was_enqueued() -> None:
    url = "postgresql://leaseq@127.0.0.1:1/nowhere?connect_timeout=2"
    with pytest.raises(leaseq.DatabaseUnavailable) as caught:
        leaseq.connect(url, action="enqueue")
    message = str(caught.value)
    assert "127.0.0.1:1" in message and "nothing was enqueued" in message
    pool = leaseq.open_pool(url, timeout=1)
    try:
        unreachable = r"127\.0\.0\.1:1.*nothing was enqueued"
        with pytest.raises(leaseq.DatabaseUnavailable, match=unreachable):
            leaseq.Queue(pool).enqueue("q", "t")
    finally:
        pool.close()


def test_unmigrated_database_says_to_run_migrate(empty_database_url: str) -> None:
    with leaseq.connect(empty_database_url, action="test") as conn:
        with pytest.raises(leaseq.SchemaNotReady, match="leaseq migrate"):
            leaseq.Queue(conn).enqueue("q", "t")
        with pytest.raises(leaseq.SchemaNotReady, match="leaseq migrate"):
            leaseq.check_schema(conn)


def test_database_constraints_back_up_validation(conn: leaseq.core.db.Conn) -> None:
    """A row written around the API is still refused by the schema's CHECKs."""
    with pytest.raises(Exception, match="jobs_running_leased"):
        conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, status) VALUES ('q', 't', 'running')"
        )
