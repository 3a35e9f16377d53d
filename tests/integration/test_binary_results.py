"""The statements whose rows a worker reads in binary return only types psycopg can load
from binary.

psycopg loads a column of a type it has no binary loader for (an enum, a type of leaseq's
own) as bytes, where the same column in text comes back as str: a claim returning such a
column would hand handlers and metrics bytes. Each statement is described as the server
prepares it (RowDescription: the base type of a domain column), and every column's type
must have a binary loader on the worker's connection.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest
from psycopg.pq import Format

import leaseq
from leaseq.core._store import statements
from leaseq.core._store.store import BINARY_RESULTS
from support.plans import generic


@pytest.mark.parametrize("name", sorted(BINARY_RESULTS))
def test_every_column_of_a_binary_statement_loads_from_binary(database_url: str, name: str) -> None:
    query, _ = generic(statements.load()[name].query)
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.Queue.tune_worker_session(conn)
        prepared = conn.pgconn.prepare(b"described", query.encode())
        assert prepared.status == psycopg.pq.ExecStatus.COMMAND_OK, prepared.error_message
        described = conn.pgconn.describe_prepared(b"described")
        columns = [(described.fname(i), described.ftype(i)) for i in range(described.nfields)]
        assert columns
        unloadable = [
            (str(column, "utf-8") if column else "", oid)
            for column, oid in columns
            if conn.adapters.get_loader(oid, Format.BINARY) is None
        ]
        assert not unloadable, f"{name}: no binary loader for {unloadable}"


def test_a_binary_claim_returns_python_values_not_bytes(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t", {"pages": [1, 2]}, timeout=30.0)
    (job,) = queue.claim(["q"], "w1")
    assert (job.queue, job.job_type, job.payload) == ("q", "t", {"pages": [1, 2]})
    assert isinstance(job.lease.started_at, datetime)
    assert isinstance(job.lease_expires_at, datetime)
    assert job.timeout_seconds == 30.0
