"""`leaseq jobs list | head` and `leaseq status --watch | head -1`: when the reader closes
the pipe early, the CLI stops quietly (128 + SIGPIPE, like other tools), no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import leaseq

pytestmark = pytest.mark.process

QUIET_EXIT = 128 + signal.SIGPIPE


def _leaseq(*argv: str, stdout: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "leaseq.cli", *argv], stdout=stdout, stderr=subprocess.PIPE
    )


def test_jobs_list_into_a_closed_pipe_ends_quietly(database_url: str, queue: leaseq.Queue) -> None:
    for n in range(5):
        queue.enqueue("ocr", "extract", {"doc": n})
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        proc = _leaseq("jobs", "list", "--database-url", database_url, stdout=write_end)
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == QUIET_EXIT


def test_status_watch_ends_quietly_when_its_reader_stops_reading(
    database_url: str, queue: leaseq.Queue
) -> None:
    queue.enqueue("ocr", "extract", {})
    proc = _leaseq(
        "status", "--watch", "0.1", "--database-url", database_url, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().split()[0] == b"QUEUE"  # the first refresh arrived
    proc.stdout.close()  # `head -1` exits
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == QUIET_EXIT
