"""The FastAPI example service (leaseq.examples.service) in front of a real PostgreSQL and a
real `leaseq worker --app leaseq.examples.service:registry` process: enqueue and wait, enqueue
and come back, a dead job, a job still running when the wait ends, bad input, no such job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import leaseq
from leaseq.examples import service
from support.workers import Workers

pytestmark = pytest.mark.process


@pytest.fixture
def client(database_url: str, tmp_path: Path) -> Iterator[TestClient]:
    workers = Workers(database_url, tmp_path)
    workers.start(
        "svc",
        "--app", "leaseq.examples.service:registry",
        "--queue", service.QUEUE,
        "--poll-seconds", "3600",
    )  # fmt: skip
    try:
        with TestClient(service.create_app(database_url)) as http:
            yield http
    finally:
        workers.stop_all()


def test_post_and_wait_returns_the_result(client: TestClient) -> None:
    answer = client.post(
        "/jobs", json={"job_type": "echo", "payload": {"doc": 412}, "wait_seconds": 60}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "succeeded"
    assert body["result"] == {"echo": {"doc": 412}, "attempt": 1}


def test_post_returns_the_id_and_get_waits_for_the_result(client: TestClient) -> None:
    answer = client.post("/jobs", json={"job_type": "echo", "payload": "hi"})
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    assert answer.headers["location"] == f"/jobs/{job_id}"
    done = client.get(f"/jobs/{job_id}", params={"wait_seconds": 60})
    assert done.status_code == 200, done.text
    assert done.json()["result"] == {"echo": "hi", "attempt": 1}


def test_a_dead_job_answers_502_with_its_error(client: TestClient) -> None:
    answer = client.post(
        "/jobs",
        json={"job_type": "echo", "payload": {"fail": "page 3 is blank"}, "wait_seconds": 60},
    )
    assert answer.status_code == 502, answer.text
    assert answer.json()["detail"]["last_error"] == "PermanentError: page 3 is blank"


def test_a_job_still_running_when_the_wait_ends_answers_202_and_keeps_running(
    client: TestClient, database_url: str
) -> None:
    # No worker serves this job type, so it is still pending when the wait ends.
    answer = client.post("/jobs", json={"job_type": "unserved", "wait_seconds": 0.2})
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "pending"
    with leaseq.connect(database_url, action="test") as conn:
        assert leaseq.Queue(conn).get(answer.json()["id"]).status == "pending"


def test_bad_input_and_unknown_jobs(client: TestClient) -> None:
    bad = client.post("/jobs", json={"job_type": " "})
    assert bad.status_code == 422
    assert "job_type" in bad.json()["detail"]
    assert client.get("/jobs/999999").status_code == 404
    assert client.get("/jobs/999999", params={"wait_seconds": 1}).status_code == 404
