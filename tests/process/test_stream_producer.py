"""A producer process reads a job's stream from offset 0, is SIGKILLed, and a new one started
with its last offset gets exactly the items after it, then the end."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import leaseq
from leaseq.runtime.context import JobContext
from support.dbtime import claim_one
from support.polling import wait_for

pytestmark = pytest.mark.process

READER = """
import json, sys
import leaseq
url, job, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with leaseq.connect(url, action="read stream") as conn:
    for item in leaseq.Queue(conn).stream(job, after=after, poll=0.05):
        print(item.offset, json.dumps(item.value), flush=True)
print("end", flush=True)
"""


def reader(database_url: str, job_id: int, after: int, out: Path) -> subprocess.Popen[bytes]:
    with out.open("wb") as f:
        return subprocess.Popen(
            [sys.executable, "-c", READER, database_url, str(job_id), str(after)], stdout=f
        )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_killed_producer_resumes_from_its_last_offset(
    queue: leaseq.Queue, database_url: str, tmp_path: Path
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    job = claim_one(queue)
    ctx = JobContext(job, queue, "w1", threading.Event())
    for page in (1, 2, 3):
        ctx.emit({"page": page})

    first = reader(database_url, job_id, 0, tmp_path / "first")
    seen = wait_for(lambda: len(got := lines(tmp_path / "first")) == 3 and got, "three items")
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    last = int(seen[-1].split()[0])

    for page in (4, 5):
        ctx.emit({"page": page})
    queue.complete(job.lease, "done")
    second = reader(database_url, job_id, last, tmp_path / "second")
    assert second.wait(timeout=60) == 0
    assert seen == ['1 {"page": 1}', '2 {"page": 2}', '3 {"page": 3}']
    assert lines(tmp_path / "second") == ['4 {"page": 4}', '5 {"page": 5}', "end"]
