"""A database role per component (issue 11): each can do its job and nothing else.

Every check runs on a real PostgreSQL as a real LOGIN role granted by
`leaseq migrate --worker-role ... --operator-role ... --producer-role ...` (the SQL function
leaseq.apply_grants, run by Schema.migrate after the migrations).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

import leaseq
import leaseq.core.history
from leaseq.core import waiters
from leaseq.core._store.store import Store
from leaseq.leader.history import HistoryDuty
from support import threat_model
from support.polling import wait_for
from support.roles import Roles, login_roles
from support.threat_model import ORDER

DENIED = pg_errors.InsufficientPrivilege


PRIVILEGES = """
SELECT 'schema', n.nspname, NULL::text, a.privilege_type, 0
  FROM pg_namespace n, aclexplode(n.nspacl) a
 WHERE n.nspname = 'leaseq' AND a.grantee = %(role)s::regrole
UNION ALL
SELECT 'table', c.relname, NULL, a.privilege_type, 0
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq',
       aclexplode(c.relacl) a
 WHERE a.grantee = %(role)s::regrole
UNION ALL
SELECT 'column', c.relname, att.attname, a.privilege_type, att.attnum
  FROM pg_attribute att
  JOIN pg_class c ON c.oid = att.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq',
       aclexplode(att.attacl) a
 WHERE a.grantee = %(role)s::regrole
"""


def observed_privileges(conn: psycopg.Connection[tuple[object, ...]], role: str) -> list[str]:
    """The role's privileges on leaseq's objects, read from the catalogs, one line each."""
    rows = conn.execute(PRIVILEGES, {"role": role}).fetchall()
    schema = [f"{p} on schema {name}" for kind, name, _, p, _ in rows if kind == "schema"]
    tables = sorted(
        (str(name), ORDER.index(str(p))) for kind, name, _, p, _ in rows if kind == "table"
    )
    columns: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for kind, name, column, p, num in rows:
        if kind == "column":
            columns.setdefault((str(name), str(p)), []).append((int(str(num)), str(column)))
    lines = [*schema, *(f"{ORDER[p]} on {name}" for name, p in tables)]
    for (name, p), cols in sorted(columns.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        lines.append(f"{p} ({', '.join(c for _, c in sorted(cols))}) on {name}")
    return lines


def apply_grants(url: str, roles: Roles) -> list[str]:
    """What `leaseq migrate --worker-role ... --operator-role ... --producer-role ...` does."""
    names = roles.names
    with leaseq.connect(url, action="migrate") as conn:
        report = leaseq.migrate(
            conn,
            leaseq.ComponentRoles(names["worker"], names["operator"], names["producer"]),
        )
    return report.grants


@pytest.fixture
def roles(database_url: str) -> Iterator[Roles]:
    with login_roles(database_url, "producer2") as made:
        apply_grants(database_url, made)
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("GRANT {} TO {}").format(
                    sql.Identifier(made.names["producer"]), sql.Identifier(made.names["producer2"])
                )
            )
        yield made


def as_role(roles: Roles, component: str) -> leaseq.db.Conn:
    return leaseq.connect(roles.urls[component], action="test")


def raw(roles: Roles, component: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(roles.urls[component], autocommit=True)


# -- what each role holds --------------------------------------------------------------------


def test_each_role_holds_exactly_its_documented_privileges(database_url: str, roles: Roles) -> None:
    """As the threat model (sql/leaseq_sql/definitions/threat_model.toml) declares them."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        version = int(str(admin.execute("SHOW server_version_num").fetchone()[0]))  # type: ignore[index]
        for component in ("worker", "operator", "producer"):
            want = threat_model.privilege_lines(component, version)
            assert observed_privileges(admin, roles.names[component]) == want, component


def test_grants_are_idempotent_and_a_replaced_role_keeps_nothing(
    database_url: str, roles: Roles
) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        before = {c: observed_privileges(admin, n) for c, n in roles.names.items()}
    again = apply_grants(database_url, roles)
    assert any(s.startswith("REVOKE ALL ON ALL TABLES IN SCHEMA leaseq FROM") for s in again)
    with psycopg.connect(database_url, autocommit=True) as admin:
        assert {c: observed_privileges(admin, n) for c, n in roles.names.items()} == before
        policies = admin.execute("SELECT count(*) FROM pg_policies WHERE schemaname = 'leaseq'")
        # 20 as of migration 0012; migration 0030 added 15 for the tables that got row
        # level security (workers, schedules, job_deps, pipelines, flow_slots), 0033 five
        # for job_steps, four for job_stream, 0036 four for job_signals, 0040 two for the
        # worker's fan-out owner (jobs, pipelines); 0048 took seven of the worker's (its
        # writes of attempts, effects, steps and stream items, its read of signals: the
        # lease_* functions do them) and its take of a unit (the claims do it), and added
        # three on whose pipeline a job joins and who finishes a pipeline; 0050 took the
        # worker's eight on writing a fan-out (lease_spawn does it) and added its two reads,
        # and one on which queues a producer enqueues into (tenants)
        assert policies.fetchone() == (40,)
    with login_roles(database_url) as fresh:
        apply_grants(
            database_url,
            Roles({**roles.names, "worker": fresh.names["worker"]}, roles.urls),
        )
        with psycopg.connect(database_url, autocommit=True) as admin:
            assert observed_privileges(admin, roles.names["worker"]) == []
            assert observed_privileges(admin, fresh.names["worker"]) == before["worker"]
        with raw(roles, "worker") as old, pytest.raises(DENIED):
            old.execute("SELECT * FROM leaseq.jobs")


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        (("w", "w", "p"), "more than one component"),
        (("w", "postgres", "p"), "superuser or has BYPASSRLS"),
    ],
)
def test_grants_refuse_roles_no_policy_would_hold(
    database_url: str, roles: Roles, given: tuple[str, str, str], problem: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        superuser = admin.info.user
        names = {"w": roles.names["worker"], "p": roles.names["producer"], "postgres": superuser}
        before = observed_privileges(admin, roles.names["worker"])
        with (
            leaseq.connect(database_url, action="migrate") as conn,
            pytest.raises(leaseq.DatabaseError, match=problem),
        ):
            leaseq.migrate(conn, leaseq.ComponentRoles(*(names[g] for g in given)))
        assert observed_privileges(admin, roles.names["worker"]) == before


def test_migrate_command_grants_and_prints_what_it_ran(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    from leaseq.cli.main import main

    argv = ["migrate", "--database-url", database_url]
    names = roles.names
    flags = [f"--{c}-role={names[c]}" for c in ("worker", "operator", "producer")]
    assert main([*argv, *flags]) == 0
    out = capsys.readouterr().out
    assert "nothing to apply" in out
    assert f"GRANT USAGE ON SCHEMA leaseq TO {names['worker']}" in out
    assert main([*argv, "--worker-role", "no_such_role_here"]) == 2
    err = capsys.readouterr().err
    assert 'role "no_such_role_here" does not exist' in err and "create the role" in err


def test_only_the_owner_may_apply_grants(roles: Roles) -> None:
    with raw(roles, "operator") as op, pytest.raises(DENIED):
        op.execute("SELECT leaseq.apply_grants(NULL, NULL, NULL)")


def test_a_non_superuser_owner_migrates_and_grants(empty_database_url: str) -> None:
    """The migrate role needs only CREATE on the database (and to own what it creates)."""
    with login_roles(empty_database_url, "owner") as made:
        owner = made.names["owner"]
        with psycopg.connect(empty_database_url, autocommit=True) as admin:
            dbname = admin.info.dbname
            admin.execute(
                sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                    sql.Identifier(dbname), sql.Identifier(owner)
                )
            )
        with leaseq.connect(made.urls["owner"], action="migrate") as conn:
            leaseq.migrate(conn)
        statements = apply_grants(made.urls["owner"], made)
        assert statements[0].startswith("REVOKE ALL ON ALL TABLES IN SCHEMA leaseq FROM lq_")
        with as_role(made, "producer") as p:
            job = leaseq.Queue(p).enqueue("q", "t", {"n": 1})
        with as_role(made, "worker") as w:
            [claimed] = leaseq.Queue(w).claim(["q"], "w1")
            assert claimed.id == job.job_id
            assert isinstance(leaseq.Queue(w).complete(claimed.lease, {"ok": 1}), leaseq.Completed)


# -- each role can do its job ---------------------------------------------------------------


def test_worker_does_its_job(database_url: str, roles: Roles) -> None:
    with as_role(roles, "producer") as p:
        # Keyed, so the completion writes an effect row (the worker's INSERT on job_results).
        ids = [
            leaseq.Queue(p).enqueue("q", "t", {"n": n}, idempotency_key=f"doc-{n}").job_id
            for n in range(4)
        ]
    with as_role(roles, "worker") as w:
        queue, registry = leaseq.Queue(w), leaseq.Workers(w)
        assert leaseq.check_schema(w) >= 3
        for state, in_flight in ((leaseq.WorkerState.RUNNING, 0), (leaseq.WorkerState.DRAINING, 3)):
            registry.register(
                "w1", pod="p", node="n", queues=["q"], concurrency=4, state=state,
                in_flight=in_flight,
            )  # fmt: skip
        jobs = queue.claim(["q"], "w1", limit=4, lease_seconds=30)
        assert sorted(j.id for j in jobs) == ids
        a, b, c, d = jobs
        assert queue.heartbeat(a.lease, progress={"p": 1}).status.name == "RENEWED"
        assert queue.checkpoint(a.lease, {"page": 2})
        done = queue.complete(a.lease, {"ok": True})
        assert isinstance(done, leaseq.Completed) and done.effect_written
        assert queue.fail(b.lease, "boom", traceback="Traceback: boom").status == "pending"
        assert isinstance(queue.release(c.lease), leaseq.Released)
        assert queue.get(a.id).status == "succeeded"
        assert queue.effect(done.effect_key) is not None
        assert [(x.outcome, x.traceback) for x in queue.attempts(b.id)] == [
            ("failed", "Traceback: boom")
        ]
        assert registry.remove("w1")
    with as_role(roles, "operator") as o:
        reaped = leaseq.Queue(o).reap(now=d.lease_expires_at + timedelta(seconds=1))
        assert [r.job_id for r in reaped] == [d.id]
    with as_role(roles, "worker") as w:
        # The stale worker's call is refused and recorded: lease_expired becomes fenced.
        assert isinstance(leaseq.Queue(w).complete(d.lease, {}), leaseq.Fenced)
        assert [x.outcome for x in leaseq.Queue(w).attempts(d.id)] == ["fenced"]


def test_operator_does_its_job(database_url: str, roles: Roles) -> None:
    with as_role(roles, "producer") as p:
        producer = leaseq.Queue(p)
        running, dead, pending = (producer.enqueue("q", "t", max_attempts=1).job_id for _ in "abc")
    with as_role(roles, "worker") as w:
        worker = leaseq.Queue(w)
        first, second = worker.claim(["q"], "w1", limit=2)
        worker.fail(second.lease, "bad", retryable=False)
        leaseq.Workers(w).register(
            "w1", pod=None, node=None, queues=["q"], concurrency=1,
            state=leaseq.WorkerState.RUNNING, in_flight=1,
        )  # fmt: skip
    with as_role(roles, "operator") as o:
        queue, registry, leadership = leaseq.Queue(o), leaseq.Workers(o), leaseq.Leadership(o)
        assert leaseq.check_schema(o) >= 3
        stats = {s.queue: s for s in queue.stats()}
        assert (stats["q"].ready, stats["q"].running, stats["q"].dead) == (1, 1, 1)
        coming = leaseq.Schedules(o).coming(["q"], horizon=60)  # what the pool warms up for
        assert (coming.delayed, coming.slots) == (0, ())
        acquired = leadership.acquire("reaper", "op-1", term=0, ttl=15)
        assert acquired is not None
        with leadership.reap_pass("reaper", "op-1", acquired.term, ttl=15) as locked:
            assert locked is not None
        assert [w.worker_id for w in registry.list()] == ["w1"]
        assert registry.forget_silent(silent_for=1, now=first.lease_expires_at) == ["w1"]
        assert queue.retry_dead(dead) >= 1
        assert queue.cancel(pending).cancelled
        reaped = queue.reap(now=first.lease_expires_at + timedelta(seconds=1))
        assert [r.job_id for r in reaped] == [running]
        assert queue.get(running).status == "dead"
        assert queue.prune(older_than=0, now=first.lease_expires_at + timedelta(hours=1)) == 2
        queue.vacuum(min_dead_tuples=1)
        assert leadership.release("reaper", "op-1", term=acquired.term)


def test_operator_runs_the_history_duties(database_url: str, roles: Roles) -> None:
    with as_role(roles, "producer") as p:
        ids = [leaseq.Queue(p).enqueue("q", "t").job_id for _ in range(3)]
    with as_role(roles, "worker") as w:
        worker = leaseq.Queue(w)
        for job in worker.claim(["q"], "w1", limit=3):
            worker.complete(job.lease, {"ok": True}, effect_key=f"e{job.id}")
    with as_role(roles, "operator") as o:
        history = leaseq.core.history.History(o)
        now = o.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        duty = HistoryDuty(history, 0.0, timeout=10.0, budget=60.0)
        duty.partitions(now + timedelta(seconds=1))
        assert duty.move(now + timedelta(seconds=1)) == 3
        assert history.whereabouts(ids[0])[0].place == "history"
        history.set_retention("succeeded", 3, queue="q")
        assert duty.retention(now + timedelta(days=8))  # effects deleted, partitions dropped
        assert history.whereabouts(ids[0])[0].place == "ledger"
        assert duty.ledger(now + timedelta(days=401)) == 3
        assert duty.metrics.failures.labels("move")._value.get() == 0


def test_producer_enqueues_and_reads_only_its_own_jobs(database_url: str, roles: Roles) -> None:
    with as_role(roles, "producer") as p:
        mine = leaseq.Queue(p).enqueue("q", "t", {"n": 1}, dedup_key="d").job_id
        assert leaseq.Queue(p).enqueue("q", "t", {"n": 1}, dedup_key="d").job_id == mine
    with as_role(roles, "producer2") as p2:
        theirs = leaseq.Queue(p2).enqueue("q", "t", {"n": 2}).job_id
        assert [j.id for j in leaseq.Queue(p2).jobs()] == [theirs]
        with pytest.raises(leaseq.JobNotFound):
            leaseq.Queue(p2).get(mine)
        # The dedup key is per queue, whoever holds it; this producer cannot see the holder,
        # and the error does not say whose it is (another producer's, or a concurrent one).
        with pytest.raises(leaseq.JobStateError, match="per queue across all producers") as e:
            leaseq.Queue(p2).enqueue("q", "t", dedup_key="d")
        assert "another" not in str(e.value) and "exists" not in str(e.value)
        with p2.cursor() as c, pytest.raises(psycopg.errors.UniqueViolation) as raw_error:
            c.execute("SELECT * FROM leaseq.enqueue('q', 't', dedup_key => 'd')")
        assert raw_error.value.diag.message_primary == str(e.value)
    with as_role(roles, "worker") as w:
        [job] = leaseq.Queue(w).claim(["q"], "w1")
        leaseq.Queue(w).complete(job.lease, {"done": 1}, effect_key="k")
    with as_role(roles, "producer") as p:
        queue = leaseq.Queue(p)
        assert [j.id for j in queue.jobs()] == [mine]
        assert queue.get(mine).status == "succeeded"
        assert [a.outcome for a in queue.attempts(mine)] == ["succeeded"]
        assert queue.attempts(theirs) == []
        effect = queue.effect("k")
        assert effect is not None and effect.job_id == mine
    with psycopg.connect(database_url) as admin:
        owners = dict(admin.execute("SELECT id, enqueued_by FROM leaseq.jobs").fetchall())
    assert owners == {mine: roles.names["producer"], theirs: roles.names["producer2"]}


def test_a_worker_roles_read_of_claimable_jobs_still_walks_the_claim_index(
    roles: Roles,
) -> None:
    """Its row-level security keeps the index usable (the claims themselves run as the
    owner, in the lease_claim* functions, and may not lock a row the worker's own way)."""
    with raw(roles, "worker") as w:
        w.execute("SET enable_seqscan = off")
        plan = "\n".join(
            str(r[0])
            for r in w.execute(
                "EXPLAIN SELECT id FROM leaseq.jobs WHERE status = 'pending' AND queue = 'q'"
                " AND available_at <= now() AND key IS NULL AND NOT ordering_waiting"
                " ORDER BY priority, available_at, id LIMIT 1"
            )
        )
    assert "jobs_claim_idx" in plan, plan


# -- and nothing else -----------------------------------------------------------------------

DDL = [
    "CREATE TABLE leaseq.evil (x int)",
    "DROP TABLE leaseq.jobs",
    "ALTER TABLE leaseq.jobs ADD COLUMN evil int",
    "ALTER TABLE leaseq.jobs DISABLE ROW LEVEL SECURITY",
    "TRUNCATE leaseq.jobs",
    "CREATE INDEX evil ON leaseq.jobs (payload)",
    "DROP POLICY leaseq_worker_read ON leaseq.jobs",
    "CREATE FUNCTION leaseq.evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
]


@pytest.mark.parametrize("component", ["worker", "operator", "producer"])
@pytest.mark.parametrize("statement", DDL)
def test_no_component_runs_ddl(roles: Roles, component: str, statement: str) -> None:
    with raw(roles, component) as c, pytest.raises(DENIED):
        c.execute(statement)


def _finished_job(roles: Roles) -> tuple[int, leaseq.Lease]:
    with as_role(roles, "producer") as p:
        leaseq.Queue(p).enqueue("q", "t", {"n": 1}, idempotency_key="k1")
    with as_role(roles, "worker") as w:
        [job] = leaseq.Queue(w).claim(["q"], "w1")
        leaseq.Queue(w).complete(job.lease, {"v": "original"})
    return job.id, job.lease


WORKER_DENIED = [
    "DELETE FROM leaseq.jobs",
    "DELETE FROM leaseq.job_attempts",
    "DELETE FROM leaseq.job_results",
    "UPDATE leaseq.jobs SET payload = '{}'",
    "UPDATE leaseq.jobs SET queue = 'other'",
    "UPDATE leaseq.jobs SET max_attempts = 1000",
    "UPDATE leaseq.jobs SET idempotency_key = 'x'",
    "UPDATE leaseq.jobs SET enqueued_by = 'x'",
    "UPDATE leaseq.job_results SET result = '{}'",
    "UPDATE leaseq.job_attempts SET worker = 'x'",
    "INSERT INTO leaseq.jobs (queue, job_type) VALUES ('q', 't')",
    "INSERT INTO leaseq.leader_leases VALUES ('reaper', 'w', 1, now())",
    "SELECT * FROM leaseq.leader_leases",
    "SELECT * FROM leaseq.component_roles",
    "INSERT INTO leaseq.schema_migrations VALUES (99, 'x')",
]


def test_worker_cannot_rewrite_a_finished_job_or_its_history(
    database_url: str, roles: Roles
) -> None:
    job_id, lease = _finished_job(roles)
    with raw(roles, "worker") as w:
        # Neither column is the worker's: a running attempt writes through the lease_*
        # functions, which check its lease's secret.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            w.execute(
                "UPDATE leaseq.jobs SET result = '{\"v\": \"forged\"}', status = 'pending',"
                " finished_at = NULL WHERE id = %s",
                [job_id],
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            w.execute(
                "UPDATE leaseq.job_attempts SET outcome = 'fenced', error = 'forged'"
                " WHERE job_id = %s",
                [job_id],
            )
        # The API's own fenced call on a finished job changes nothing either.
        assert isinstance(leaseq.Queue(w).complete(lease, {"v": "again"}), leaseq.Fenced)  # type: ignore[arg-type]
        with pytest.raises(leaseq.DatabaseError, match="permission denied"):
            leaseq.Queue(w).prune(older_than=0)  # type: ignore[arg-type]
    with psycopg.connect(database_url) as admin:
        row = admin.execute(
            "SELECT status::text, result FROM leaseq.jobs WHERE id = %s", [job_id]
        ).fetchone()
        outcomes = admin.execute(
            "SELECT outcome::text, error FROM leaseq.job_attempts WHERE job_id = %s", [job_id]
        ).fetchall()
    assert row == ("succeeded", {"v": "original"})
    assert outcomes == [("succeeded", None)]


OPERATOR_DENIED = [
    "INSERT INTO leaseq.jobs (queue, job_type) VALUES ('q', 't')",
    "UPDATE leaseq.jobs SET payload = '{}'",
    "UPDATE leaseq.jobs SET result = '{}'",
    "UPDATE leaseq.jobs SET idempotency_key = 'x'",
    "INSERT INTO leaseq.job_results (queue, job_type, idempotency_key, job_id, produced_by,"
    " result) VALUES ('q', 't', 'k', 1, 'o', '{}')",
    # (DELETE on job_results is the operator's since effects follow their jobs' retention.)
    "UPDATE leaseq.job_attempts SET outcome = 'failed'",
    "INSERT INTO leaseq.workers (worker_id, queues, concurrency) VALUES ('x', '{q}', 1)",
    "SELECT * FROM leaseq.component_roles",
]


PRODUCER_DENIED = [
    "UPDATE leaseq.jobs SET payload = '{}'",
    "DELETE FROM leaseq.jobs",
    "INSERT INTO leaseq.jobs (queue, job_type, enqueued_by) VALUES ('q', 't', 'someone')",
    "INSERT INTO leaseq.jobs (queue, job_type, status) VALUES ('q', 't', 'succeeded')",
    "INSERT INTO leaseq.job_results (queue, job_type, idempotency_key, job_id, produced_by,"
    " result) VALUES ('q', 't', 'k', 1, 'o', '{}')",
    "INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, outcome)"
    " VALUES (1, 1, 1, 'w', 'succeeded')",
    "SELECT * FROM leaseq.workers",
    "SELECT * FROM leaseq.leader_leases",
]


REFUSED = [
    *[("worker", sql) for sql in WORKER_DENIED],
    *[("operator", sql) for sql in OPERATOR_DENIED],
    *[("producer", sql) for sql in PRODUCER_DENIED],
]


@pytest.mark.parametrize(("component", "statement"), REFUSED)
def test_each_role_is_refused_what_is_not_its_job(
    roles: Roles, component: str, statement: str
) -> None:
    """The worker cannot prune or touch what is not its own, the operator cannot forge jobs
    or effects, the producer cannot claim, forge or delete."""
    _finished_job(roles)
    with raw(roles, component) as c, pytest.raises(DENIED):
        c.execute(statement)


def test_producer_cannot_claim_or_see_others_jobs_by_sql(roles: Roles) -> None:
    job_id, _ = _finished_job(roles)
    with as_role(roles, "producer2") as p2:
        with pytest.raises(leaseq.DatabaseError, match="permission denied"):
            leaseq.Queue(p2).claim(["q"], "p2")
        assert p2.execute("SELECT count(*) FROM leaseq.jobs").fetchone() == (0,)
        assert p2.execute("SELECT count(*) FROM leaseq.job_results").fetchone() == (0,)
        assert p2.execute(
            "SELECT count(*) FROM leaseq.job_attempts WHERE job_id = %s", [job_id]
        ).fetchone() == (0,)


def test_an_unregistered_role_sees_nothing(database_url: str, roles: Roles) -> None:
    with login_roles(database_url) as other, raw(other, "worker") as c, pytest.raises(DENIED):
        c.execute("SELECT * FROM leaseq.jobs")


def test_schedules_work_under_component_roles(database_url: str, roles: Roles) -> None:
    """A worker declares its schedules, the operator ticks them and enqueues exactly one job
    per slot, and the operator still cannot enqueue any other job."""
    from datetime import UTC, datetime

    spec = leaseq.ScheduleSpec("hourly", "0 * * * *", queue="q", job_type="t")
    start = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    with as_role(roles, "worker") as w:
        assert leaseq.Schedules(w).declare("app:registry", [spec], now=start) == []
    with as_role(roles, "operator") as o:
        schedules = leaseq.Schedules(o)
        tick = schedules.tick(now=start + timedelta(hours=1))
        assert tick.failed == {}
        [slot] = tick.fired
        assert slot.job_id is not None
        assert not schedules.tick(now=start + timedelta(hours=1)).fired  # once per slot
        with pytest.raises(DENIED):
            o.execute(
                "INSERT INTO leaseq.jobs (queue, job_type, idempotency_key) VALUES ('q', 't', 'x')"
            )
    with as_role(roles, "producer") as p, pytest.raises(DENIED):
        p.execute("SELECT * FROM leaseq.schedules")


def test_the_producer_waits_for_its_own_jobs_and_flags_no_other(
    database_url: str, roles: Roles, queue: leaseq.Queue
) -> None:
    """result() as the producer role flags its job (its notify_done column, no SECURITY
    DEFINER), and the worker role's completion sees the flag and wakes it; another user's
    job cannot be flagged (row-level security hides it from the UPDATE)."""
    others = queue.enqueue("other", "t").job_id  # enqueued by the owner
    with as_role(roles, "producer") as p, as_role(roles, "worker") as w:
        producer = leaseq.Queue(p)
        mine = producer.enqueue("q", "t").job_id

        def finish_once_flagged() -> None:
            wait_for(lambda: queue_has_waiter(database_url, mine), "the producer's flag on its job")
            (job,) = leaseq.Queue(w).claim(["q"], "w1", limit=1)
            leaseq.Queue(w).complete(job.lease, "mine")

        finisher = threading.Thread(target=finish_once_flagged)
        finisher.start()
        try:
            assert producer.result(mine, timeout=30, poll=3600) == "mine"
        finally:
            finisher.join()
        waiters.shared_listener(producer._conninfo()).close()
    with raw(roles, "producer") as c:
        flagged = c.execute("UPDATE leaseq.jobs SET notify_done = true WHERE id = %s", (others,))
        assert flagged.rowcount == 0
        with pytest.raises(DENIED):
            c.execute("UPDATE leaseq.jobs SET result = '1' WHERE id = %s", (mine,))
    assert not queue_has_waiter(database_url, others)


def queue_has_waiter(url: str, job_id: int) -> bool:
    with psycopg.connect(url) as c:
        found = c.execute("SELECT notify_done FROM leaseq.jobs WHERE id = %s", (job_id,))
        row = found.fetchone()
        return bool(row and row[0])


def test_a_migrate_without_roles_grants_the_registered_roles_this_versions_rights(
    database_url: str, roles: Roles
) -> None:
    """What a run that applies new migrations does when the deployment names no roles: the
    roles registered by the last run get exactly what apply_grants gives them now."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        before = {c: observed_privileges(admin, n) for c, n in roles.names.items()}
        admin.execute(
            sql.SQL("REVOKE ALL ON FUNCTION leaseq.lease_claim(text[], text[], text, integer,"
                    " double precision, uuid, bytea, timestamptz) FROM {}").format(
                sql.Identifier(roles.names["worker"])
            )
        )  # fmt: skip
        with leaseq.connect(database_url, action="migrate") as conn:
            granted = Store().grants_reapply(conn)
        assert any(f"TO {roles.names['worker']}" in s for s in granted)
        assert {c: observed_privileges(admin, n) for c, n in roles.names.items()} == before
        worker = roles.names["worker"]
        assert admin.execute(
            "SELECT has_function_privilege(%s, 'leaseq.lease_claim(text[], text[], text,"
            " integer, double precision, uuid, bytea, timestamptz)', 'EXECUTE')",
            [worker],
        ).fetchone() == (True,)


def _settings(url: str) -> tuple[str, str]:
    with psycopg.connect(url) as c:
        idle = c.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        lock = c.execute("SHOW lock_timeout").fetchone()
    assert idle is not None and lock is not None
    return str(idle[0]), str(lock[0])


def test_migrate_bounds_each_logins_idle_transactions_and_lock_waits(
    database_url: str, roles: Roles
) -> None:
    """A login of a component's role (its own, or a second one that is a member of it)
    cannot hold rows locked in an idle transaction for ever: `leaseq migrate` gives each an
    idle-in-transaction and a lock timeout, and keeps a value the deployment set itself."""
    names = roles.names
    with psycopg.connect(database_url, autocommit=True) as admin:
        # producer2 became a member after the fixture's grants; the operator's own choice.
        admin.execute(sql.SQL("ALTER ROLE {} SET lock_timeout = '5s'").format(
            sql.Identifier(names["operator"])))  # fmt: skip
    granted = apply_grants(database_url, roles)
    assert any("ALTER ROLE" in s and names["producer2"] in s for s in granted)
    assert _settings(roles.urls["worker"]) == ("1min", "30s")
    assert _settings(roles.urls["producer2"]) == ("1min", "30s")
    assert _settings(roles.urls["operator"]) == ("1min", "5s")
    # An idle transaction of a second producer login ends, and its row lock with it.
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER ROLE {} SET idle_in_transaction_session_timeout = '1s'")
                      .format(sql.Identifier(names["producer2"])))  # fmt: skip
    with leaseq.connect(roles.urls["producer2"], action="test") as p:
        mine = leaseq.Queue(p).enqueue("roles", "t", {}).job_id
    idler = psycopg.connect(roles.urls["producer2"])
    try:
        idler.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", (mine,))
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SET lock_timeout = '30s'")  # bounds this test if the idler stays
            admin.execute("UPDATE leaseq.jobs SET priority = 7 WHERE id = %s", (mine,))
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            idler.execute("SELECT 1")
    finally:
        idler.close()
