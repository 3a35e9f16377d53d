"""Rows holding the values a column can hold but a reader may not expect: ``-infinity``,
``infinity``, a year past 9999 (beyond Python's datetime), a 1 MiB payload, and a flood of
queues. Written directly as the owner, as rows written before the database refused them (or
by the owner itself) would be."""

from __future__ import annotations

from dataclasses import dataclass

import leaseq

#: The queue the bad rows are in, and one with only ordinary rows next to it.
BAD = "badq"
GOOD = "goodq"
#: Timestamp values PostgreSQL stores that Python's datetime cannot hold.
#: What the extreme pending jobs wait for: control characters, a bidi override, 5,000 characters.
WAITING_FOR = "approve\x1b[31m\u202e" + "x" * 5000
EXTREMES = ("-infinity", "infinity", "20000-01-01 00:00:00+00")
#: The size of the large payload (one JSON string of this many characters).
MIB = 1 << 20


@dataclass(frozen=True)
class Planted:
    """The ids of the planted rows: pending jobs due at each extreme (the one past 9999 of
    a key paused until then), a running job whose every lease time is extreme, a dead job
    finished past 9999, the 1 MiB job, an ordinary job in GOOD, a pipeline of extreme times
    holding the dead job."""

    pending: dict[str, int]
    running: int
    dead: int
    big: int
    good: int
    pipeline: int


def plant(conn: leaseq.core.db.Conn) -> Planted:
    """Write the bad rows (``conn`` is the owner's): see :class:`Planted`. Also a flow key
    of BAD paused until past 9999, a worker whose heartbeat and start are extreme, a
    succeeded attempt that started at -infinity, and a schedule of BAD firing after 9999
    whose last slot was at -infinity."""
    queue = leaseq.Queue(conn)
    pending: dict[str, int] = {}
    for value in EXTREMES:
        # The one due past 9999 is of a key paused until then as well.
        key = "tenant-a" if value.startswith("20000") else None
        job_id = queue.enqueue(BAD, "extreme", {"at": value}, key=key).job_id
        # Each waits for a signal (ctx.wait_for) of a name no handler would send, since the
        # same extreme time, and has one signal sent at it.
        conn.execute(
            "UPDATE leaseq.jobs SET available_at = %s, waiting_for = %s, waiting_since = %s"
            " WHERE id = %s",
            (value, WAITING_FOR, value, job_id),
        )
        conn.execute(
            "INSERT INTO leaseq.job_signals (job_id, name, payload, sent_at, sent_by)"
            " VALUES (%s, %s, 'null', %s, %s)",
            (job_id, WAITING_FOR[:200], value, WAITING_FOR),
        )
        pending[value] = job_id
    running = queue.enqueue(BAD, "extreme", {"at": "running"}).job_id
    conn.execute(
        "UPDATE leaseq.jobs SET status = 'running', lease_owner = 'w-bad', lease_token = 7,"
        " attempt_count = 1, started_at = '-infinity', heartbeat_at = '-infinity',"
        " lease_expires_at = 'infinity', created_at = '-infinity' WHERE id = %s",
        (running,),
    )
    dead = queue.enqueue(BAD, "extreme", {"at": "dead"}).job_id
    conn.execute(
        "UPDATE leaseq.jobs SET status = 'dead', attempt_count = 1, last_error = 'boom',"
        " finished_at = '20000-01-01', started_at = 'infinity', heartbeat_at = '20000-01-01'"
        " WHERE id = %s",
        (dead,),
    )
    conn.execute(
        "INSERT INTO leaseq.job_attempts (job_id, lease_token, attempt, worker, outcome,"
        " started_at, ended_at, error) VALUES (%s, 1, 1, 'w-bad', 'failed', '-infinity',"
        " '20000-01-01', 'boom')",
        (dead,),
    )
    big = queue.enqueue(BAD, "big").job_id
    conn.execute(
        "UPDATE leaseq.jobs SET payload = jsonb_build_object('blob', repeat('x', %s))"
        " WHERE id = %s",
        (MIB, big),
    )
    good = queue.enqueue(GOOD, "ordinary", {"n": 1}).job_id
    conn.execute(
        "INSERT INTO leaseq.flow_keys (queue, key, paused_until) VALUES (%s, 'tenant-a',"
        " '20000-01-01') ON CONFLICT (queue, key) DO UPDATE SET paused_until = '20000-01-01'",
        (BAD,),
    )
    leaseq.Workers(conn).register(
        "w-bad", pod=None, node=None, queues=[BAD], concurrency=1,
        state=leaseq.WorkerState.RUNNING, in_flight=1,
    )  # fmt: skip
    conn.execute(
        "UPDATE leaseq.workers SET heartbeat_at = '-infinity', started_at = 'infinity'"
        " WHERE worker_id = 'w-bad'"
    )
    [(pipeline,)] = conn.execute(
        "INSERT INTO leaseq.pipelines (name, total, dead, created_at, finished_at)"
        " VALUES ('bad-pipe', 1, 1, '-infinity', '20000-01-01') RETURNING id"
    ).fetchall()
    conn.execute("UPDATE leaseq.jobs SET pipeline_id = %s WHERE id = %s", (pipeline, dead))
    # An attempt that ended just now after starting at -infinity: a run-time sample.
    done = queue.enqueue(BAD, "extreme", {"at": "done"}).job_id
    conn.execute(
        "UPDATE leaseq.jobs SET status = 'succeeded', attempt_count = 1, finished_at = now()"
        " WHERE id = %s",
        (done,),
    )
    conn.execute(
        "INSERT INTO leaseq.job_attempts (job_id, lease_token, attempt, worker, outcome,"
        " started_at, ended_at) VALUES (%s, 1, 1, 'w-bad', 'succeeded', '-infinity', now())",
        (done,),
    )
    # A schedule that fires after 9999, whose last slot was at -infinity.
    conn.execute(
        "INSERT INTO leaseq.schedules (name, cron, queue, job_type, declared_by, fire_after,"
        " last_slot) VALUES ('bad-schedule', '* * * * *', %s, 'extreme', 'code',"
        " '20000-01-01', '-infinity')",
        (BAD,),
    )
    conn.execute(
        "INSERT INTO leaseq.schedule_slots (name, slot, outcome, recorded_at)"
        " VALUES ('bad-schedule', '-infinity', 'skipped', now())"
    )
    return Planted(pending, running, dead, big, good, pipeline)


def flood(conn: leaseq.core.db.Conn, queues: int = 200) -> None:
    """One pending job in each of ``queues`` queues (flood-000 ...)."""
    conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type, payload)"
        " SELECT format('flood-%%s', lpad(g::text, 3, '0')), 'flood', '{}'"
        " FROM generate_series(1, %s) g",
        (queues,),
    )
