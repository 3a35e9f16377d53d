"""The triggers and constraints of ``leaseq.jobs`` keep their meaning in their smaller form
(migrations 20 and 25): PostgreSQL rebuilds both kinds of expression in every statement that
updates the table, so their size is paid at every claim, completion and heartbeat."""

from __future__ import annotations

import itertools
import re

import psycopg
import pytest

import leaseq

STATUSES = ("waiting", "pending", "running", "succeeded", "dead", "cancelled")
FINISHED = {"succeeded", "dead", "cancelled"}

# Each trigger's WHEN clause as migrations 11, 12, 15 and 18 wrote it: the meaning to keep.
WRITTEN_BEFORE = {
    "jobs_notify_done": "NEW.notify_done AND NEW.status IN ('succeeded', 'dead', 'cancelled')"
    " AND OLD.status IS DISTINCT FROM NEW.status",
    # Its function did nothing unless the job was or is finished (migration 26 says so).
    "jobs_pipeline_transition": "OLD.status IS DISTINCT FROM NEW.status"
    " AND (NEW.has_children OR NEW.pipeline_id IS NOT NULL)"
    " AND (OLD.status IN ('succeeded', 'dead', 'cancelled')"
    " OR NEW.status IN ('succeeded', 'dead', 'cancelled'))",
    "jobs_flow_release": "OLD.status = 'running' AND NEW.status <> 'running'"
    " AND OLD.key IS NOT NULL",
    "jobs_flow_head_done": "OLD.ordering_key IS NOT NULL AND NOT OLD.ordering_waiting"
    " AND OLD.status IN ('pending', 'running')"
    " AND NEW.status IN ('succeeded', 'cancelled', 'dead')",
    "jobs_flow_head_revived": "OLD.ordering_key IS NOT NULL AND OLD.status = 'dead'"
    " AND NEW.status = 'pending'",
    "jobs_flow_reactivate": "NEW.key IS NOT NULL AND NEW.status = 'pending'"
    " AND OLD.status NOT IN ('pending', 'running')",
}


# Migration 26 runs the work of all six in one trigger, jobs_on_status, each under its own
# condition, written so in its function: the trigger's clause and that condition together
# must mean what the clause first meant.
STATUS_TRIGGER = "jobs_on_status"
BRANCHES = {
    "jobs_flow_head_done": "OLD.ordering_key IS NOT NULL AND NOT OLD.ordering_waiting"
    " AND OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.status <> 'waiting'",
    "jobs_flow_head_revived": "OLD.ordering_key IS NOT NULL AND OLD.status = 'dead'"
    " AND NEW.status = 'pending'",
    "jobs_flow_reactivate": "NEW.key IS NOT NULL AND NEW.status = 'pending'"
    " AND (OLD.finished_at IS NOT NULL OR OLD.status IN ('waiting', 'held'))",
    "jobs_flow_release": "OLD.key IS NOT NULL AND OLD.lease_expires_at IS NOT NULL"
    " AND NEW.lease_expires_at IS NULL",
    "jobs_notify_done": "NEW.notify_done AND NEW.finished_at IS NOT NULL"
    " AND OLD.status IS DISTINCT FROM NEW.status",
    "jobs_pipeline_transition": "OLD.status IS DISTINCT FROM NEW.status"
    " AND (NEW.has_children OR NEW.pipeline_id IS NOT NULL)"
    " AND (OLD.finished_at IS NOT NULL OR NEW.finished_at IS NOT NULL)",
}
#: Checks the columns that only an enqueue writes, where they are written (migration 25).
WRITTEN_CHECK = "jobs_check_written"


def _update_triggers(conn: leaseq.core.db.Conn) -> dict[str, tuple[list[str], str]]:
    """Each row trigger that fires on UPDATE of leaseq.jobs after the row is written: its
    columns and WHEN clause."""
    rows = conn.execute(
        "SELECT t.tgname, array(SELECT a.attname FROM unnest(t.tgattr) c(n)"
        "  JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = c.n)::text[],"
        " pg_get_triggerdef(t.oid)"
        " FROM pg_trigger t WHERE t.tgrelid = 'leaseq.jobs'::regclass AND NOT t.tgisinternal"
        " AND t.tgtype & 16 <> 0"  # TRIGGER_TYPE_UPDATE
        " AND t.tgname <> %s",
        (WRITTEN_CHECK,),
    ).fetchall()
    found = {}
    for name, columns, definition in rows:
        when = re.search(r" WHEN \((.*)\) EXECUTE FUNCTION ", definition)
        assert when is not None, f"{name} has no WHEN clause: {definition}"
        found[name] = (list(columns), when.group(1))
    return found


def test_every_update_trigger_fires_on_status_only(conn: leaseq.core.db.Conn) -> None:
    """An update that does not set status (a heartbeat, a checkpoint) reads no trigger's
    WHEN clause."""
    triggers = _update_triggers(conn)
    assert {name: columns for name, (columns, _) in triggers.items()} == {
        STATUS_TRIGGER: ["status"]
    }
    [columns] = conn.execute(
        "SELECT array(SELECT a.attname FROM unnest(t.tgattr) c(n)"
        "  JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = c.n ORDER BY a.attname)"
        "::text[] FROM pg_trigger t WHERE t.tgrelid = 'leaseq.jobs'::regclass AND t.tgname = %s",
        (WRITTEN_CHECK,),
    ).fetchone() or [None]
    assert columns == ["job_type", "queue", "timeout"], "no claim, completion or heartbeat"


def test_a_claim_calls_no_trigger_function(database_url: str, queue: leaseq.Queue) -> None:
    """Claiming a keyed job, a job in an aggregate and a watched job queues no trigger event
    (migration 28: a job that starts running gives none of jobs_on_status's branches work);
    their completion calls the status trigger's function once each."""
    queue.enqueue("q", "t", key="tenant-42")
    queue.enqueue("q", "t", ordering_key="order-17")
    queue.enqueue("q", "t", wait=True)

    def calls(c: psycopg.Connection[tuple[int]]) -> int:
        row = c.execute(
            "SELECT coalesce(sum(calls), 0)::int FROM pg_stat_xact_user_functions"
            " WHERE schemaname = 'leaseq' AND funcname = 'jobs_on_status'"
        ).fetchone()
        assert row is not None
        return row[0]

    with psycopg.connect(database_url) as c:
        c.execute("SET track_functions = 'pl'")
        worker = leaseq.Queue(c)
        claimed = worker.claim(["q"], "w1", limit=3)
        assert len(claimed) == 3
        assert calls(c) == 0
        for job in claimed:
            worker.complete(job.lease, None)
        assert calls(c) == 3
        c.commit()
    assert {queue.get(j.id).status for j in claimed} == {leaseq.JobStatus.SUCCEEDED}


@pytest.mark.parametrize("name", sorted(WRITTEN_BEFORE))
def test_each_when_clause_means_what_it_meant(conn: leaseq.core.db.Conn, name: str) -> None:
    """Over every pair of statuses a row can pass between, with and without a key, an
    ordering key, a waiting aggregate, a watcher, children and a pipeline (finished_at set
    exactly when the status is final, as CHECK jobs_finished_at makes it), the installed
    condition (jobs_on_status's clause and the function's test of it) and the clause as
    first written agree. A job has a lease exactly while it runs (jobs_lease_only_while_running,
    jobs_running_leased)."""
    (_, when) = _update_triggers(conn)[STATUS_TRIGGER]
    [body] = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE oid = 'leaseq.jobs_on_status'::regproc"
    ).fetchone() or [""]
    assert f"IF {BRANCHES[name]} THEN" in " ".join(body.split()), "the function's own test"
    installed = f"({when}) AND ({BRANCHES[name]})"
    cases = [
        (o, n, o in FINISHED, n in FINISHED, key, ok, waiting, watched, children, pipeline)
        for o, n in itertools.product(STATUSES, repeat=2)
        for key, ok, waiting, watched, children, pipeline in itertools.product(
            (False, True), repeat=6
        )
    ]
    columns = (
        "status, finished_at, key, ordering_key, ordering_waiting, notify_done, has_children,"
        " pipeline_id, lease_expires_at"
    )

    def side(prefix: str) -> str:
        return (
            f"SELECT c.{prefix}_status::leaseq.job_status,"
            f" CASE WHEN c.{prefix}_finished THEN now() END,"
            " CASE WHEN c.keyed THEN 'k' END, CASE WHEN c.ordered THEN 'o' END,"
            " c.waiting, c.watched, c.children, CASE WHEN c.pipelined THEN 1 END,"
            f" CASE WHEN c.{prefix}_status = 'running' THEN now() END"
        )

    query = (
        "SELECT c.o_status, c.n_status, c.keyed, c.ordered, c.waiting, c.watched, c.children,"
        f" c.pipelined, ({installed}) IS TRUE, ({WRITTEN_BEFORE[name]}) IS TRUE"
        " FROM unnest(%s::text[], %s::text[], %s::bool[], %s::bool[], %s::bool[], %s::bool[],"
        "  %s::bool[], %s::bool[], %s::bool[], %s::bool[])"
        "  AS c(o_status, n_status, o_finished, n_finished, keyed, ordered, waiting, watched,"
        "       children, pipelined)"
        f" CROSS JOIN LATERAL ({side('o')}) AS old({columns})"
        f" CROSS JOIN LATERAL ({side('n')}) AS new({columns})"
    )
    rows = conn.execute(query, [list(col) for col in zip(*cases, strict=True)]).fetchall()
    assert len(rows) == len(cases)
    differ = [row[:8] for row in rows if row[8] != row[9]]
    assert differ == []


@pytest.mark.parametrize(
    ("column", "value"),
    [("key", ""), ("key", "k" * 201), ("ordering_key", ""), ("ordering_key", "o" * 201)],
    ids=["key-empty", "key-201", "ordering_key-empty", "ordering_key-201"],
)
def test_key_checks_still_refuse_bad_names_and_take_none(
    conn: leaseq.core.db.Conn, column: str, value: str
) -> None:
    conn.execute(f"INSERT INTO leaseq.jobs (queue, job_type, {column}) VALUES ('q', 't', NULL)")
    with pytest.raises(psycopg.errors.CheckViolation, match=f"jobs_{column}_name"):
        conn.execute(
            f"INSERT INTO leaseq.jobs (queue, job_type, {column}) VALUES ('q', 't', %s)", (value,)
        )


def test_timeout_check_still_refuses_zero_and_takes_none(conn: leaseq.core.db.Conn) -> None:
    conn.execute("INSERT INTO leaseq.jobs (queue, job_type, timeout) VALUES ('q', 't', NULL)")
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_timeout_positive"):
        conn.execute("INSERT INTO leaseq.jobs (queue, job_type, timeout) VALUES ('q', 't', '0')")


def test_deps_left_check_still_refuses_a_negative_count(conn: leaseq.core.db.Conn) -> None:
    row = conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type) VALUES ('q', 't') RETURNING id"
    ).fetchone()
    assert row is not None
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_deps_left"):
        conn.execute("UPDATE leaseq.jobs SET deps_left = deps_left - 1 WHERE id = %s", row)


def test_finished_is_every_status_after_running(conn: leaseq.core.db.Conn) -> None:
    """jobs_finished_at says "finished" as status > 'running' (migration 25): the type's
    order must keep the final statuses, and only them, after running."""
    after = conn.execute(
        "SELECT array(SELECT s::text FROM unnest(enum_range(NULL::leaseq.job_status)) s"
        " WHERE s > 'running')"
    ).fetchone()
    assert after is not None
    assert set(after[0]) == FINISHED


@pytest.mark.parametrize(
    ("column", "value", "constraint"),
    [
        ("queue", "-bad", "jobs_queue_name"),
        ("job_type", "", "jobs_job_type_name"),
        ("job_type", "t" * 129, "jobs_job_type_name"),
        ("timeout", "-1 second", "jobs_timeout_positive"),
    ],
)
def test_names_and_timeout_are_checked_where_written(
    conn: leaseq.core.db.Conn, column: str, value: str, constraint: str
) -> None:
    """By an insert and by an update that sets the column: the same SQLSTATE and constraint
    name as the CHECK constraints they replaced (errors.py maps the name to the field)."""
    row: dict[str, str | None] = {"queue": "q", "job_type": "t", "timeout": None, column: value}
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint) as refused:
        conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, timeout) VALUES (%s, %s, %s)",
            (row["queue"], row["job_type"], row["timeout"]),
        )
    assert refused.value.diag.constraint_name == constraint
    job = conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type) VALUES ('q', 't') RETURNING id"
    ).fetchone()
    assert job is not None
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint):
        conn.execute(f"UPDATE leaseq.jobs SET {column} = %s WHERE id = %s", (value, job[0]))
