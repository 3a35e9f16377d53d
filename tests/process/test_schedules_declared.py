"""A real worker declares its registry's schedules when it starts; one its code no longer
declares is disabled, not deleted, and shown as such by `leaseq schedules list`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from support.workers import Workers

pytestmark = pytest.mark.process

HERE = Path(__file__).parent
APP = "schedule_app:registry"


@pytest.fixture
def workers(database_url: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(database_url, tmp_path, pythonpath=[HERE])
    yield started
    started.stop_all()


def _start_and_stop(workers: Workers, names: str) -> None:
    worker = workers.start("w-sched", "--app", APP, "--queue", "periodic",
                           env={"LEASEQ_TEST_SCHEDULES": names})  # fmt: skip
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0


def test_a_worker_declares_and_disables_its_schedules(
    workers: Workers, conn: leaseq.core.db.Conn, database_url: str
) -> None:
    schedules = leaseq.Schedules(conn)
    _start_and_stop(workers, "nightly,weekly")
    assert [(s.name, s.state, s.declared_in) for s in schedules.list()] == [
        ("nightly", leaseq.ScheduleState.ACTIVE, APP),
        ("weekly", leaseq.ScheduleState.ACTIVE, APP),
    ]
    _start_and_stop(workers, "nightly")
    weekly = schedules.get("weekly")
    assert weekly.state is leaseq.ScheduleState.DISABLED
    assert weekly.disabled_reason == f"no longer declared by {APP}"
    listed = subprocess.run(
        [sys.executable, "-m", "leaseq.cli", "schedules", "list", "--json",
         "--database-url", database_url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    states = {s["name"]: s["state"] for s in json.loads(listed.stdout)}
    assert states == {"nightly": "active", "weekly": "disabled"}
