"""The attack suite: each role's own login tries what the threat model
(sql/leaseq_sql/definitions/threat_model.toml) forbids it, and what it allows.

Generated from the catalogs where it can be: every relation and function of schema leaseq
must have a decision in the model (a new one without one fails here); every privilege of every
column of every relation is tried with each login (a statement that touches no row, so only
the privilege answers) and must be refused exactly where the model gives none. Row
boundaries, which privileges cannot express, are tried one by one below; the first six are
the reproductions of issue 46 (each fails on the schema of 128adfe).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

import leaseq
from leaseq.runtime.context import JobContext
from support import threat_model
from support.polling import wait_for
from support.roles import Roles, login_roles, migrate_granting_all

DENIED = pg_errors.InsufficientPrivilege
LOGINS = ("worker", "worker2", "operator", "producer", "producer2", "console")
#: The second login of a role: a member of the first's role, holding exactly its rights.
SECOND = {"worker2": "worker", "producer2": "producer"}


@pytest.fixture
def roles(database_url: str) -> Iterator[Roles]:
    with login_roles(database_url, *SECOND, "console") as made:
        names = made.names
        migrate_granting_all(database_url, made)
        with psycopg.connect(database_url, autocommit=True) as admin:
            for second, first in SECOND.items():
                admin.execute(
                    sql.SQL("GRANT {} TO {}").format(
                        sql.Identifier(names[first]), sql.Identifier(names[second])
                    )
                )
        yield made


def login(roles: Roles, who: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(roles.urls[who], autocommit=True)


def queue_as(roles: Roles, who: str) -> leaseq.core.db.Conn:
    return leaseq.connect(roles.urls[who], action="test")


# -- every relation and function has a decision -----------------------------------------------

RELATIONS = """
SELECT c.relname, c.relkind::text, c.relrowsecurity
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND NOT c.relispartition
"""


def test_every_relation_and_function_has_a_decision(database_url: str) -> None:
    model = threat_model.relations()
    with psycopg.connect(database_url) as conn:
        found = {str(n): (str(k), bool(r)) for n, k, r in conn.execute(RELATIONS)}
        functions = {
            str(n)
            for (n,) in conn.execute(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = 'leaseq'"
            )
        }
    assert sorted(set(found) - set(model)) == [], "relations with no decision in the model"
    assert sorted(set(model) - set(found)) == [], "decisions for relations that do not exist"
    assert sorted(functions ^ set(threat_model.functions())) == [], "functions without a decision"
    for name, relation in model.items():
        writes = any(
            g.privilege in ("INSERT", "UPDATE", "DELETE")
            for grants in relation.grants.values()
            for g in grants
        )
        assert found[name][1] == relation.rls, f"{name}: row level security is not as declared"
        if writes and found[name][0] in ("r", "p"):
            assert relation.rls or relation.decision, f"{name} is written with no policy decision"


def test_functions_execute_as_declared(database_url: str, roles: Roles) -> None:
    wrong = []
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT p.proname, p.oid FROM pg_proc p JOIN pg_namespace n"
            " ON n.oid = p.pronamespace WHERE n.nspname = 'leaseq'"
        ).fetchall()
        for name, oid in rows:
            allowed = threat_model.functions()[str(name)]
            for who in ("PUBLIC", "worker", "operator", "producer", "console"):
                role = "public" if who == "PUBLIC" else roles.names[who]
                may = bool(
                    conn.execute(
                        "SELECT has_function_privilege(%s, %s::oid, 'EXECUTE')", [role, oid]
                    ).fetchone()[0]  # type: ignore[index]
                )
                if may != ("PUBLIC" in allowed or who in allowed):
                    wrong.append(f"{name}: {who} {'may' if may else 'may not'} execute it")
    assert not wrong, wrong


# -- every privilege, with each login -----------------------------------------------------------

COLUMNS = """
SELECT c.relname, c.relkind::text, a.attname
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY c.relname, a.attnum
"""


def attempts(
    conn: psycopg.Connection[tuple[object, ...]],
) -> list[tuple[str, str, str, sql.Composed]]:
    """(relation, privilege, column or "", a statement that needs exactly that privilege and
    touches no row) for every relation and column of schema leaseq."""
    out = []
    rels = {str(n): str(k) for n, k, _ in conn.execute(RELATIONS)}
    for rel, kind in rels.items():
        if kind == "S":
            continue
        table = sql.Identifier("leaseq", rel)
        out.append((rel, "SELECT", "", sql.SQL("SELECT 1 FROM {} WHERE false").format(table)))
        if kind in ("r", "p"):
            out.append((rel, "DELETE", "", sql.SQL("DELETE FROM {} WHERE false").format(table)))
    for rel, _, column in conn.execute(COLUMNS).fetchall():
        table, col = sql.Identifier("leaseq", str(rel)), sql.Identifier(str(column))
        insert = "INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT NULL WHERE false"
        update = "UPDATE {} SET {} = DEFAULT WHERE false"
        out.append((str(rel), "INSERT", str(column), sql.SQL(insert).format(table, col)))
        out.append((str(rel), "UPDATE", str(column), sql.SQL(update).format(table, col)))
    return out


def declared(component: str, relation: str, privilege: str, column: str) -> bool:
    grants = threat_model.relations()[relation].grants.get(component, ())
    return any(g.privilege == privilege and (not g.columns or column in g.columns) for g in grants)


@pytest.mark.parametrize("who", LOGINS)
def test_each_login_holds_exactly_the_declared_privileges(
    database_url: str, roles: Roles, who: str
) -> None:
    component = SECOND.get(who, who)
    with psycopg.connect(database_url) as admin:
        tried = attempts(admin)
    wrong = []
    with login(roles, who) as conn:
        for relation, privilege, column, statement in tried:
            try:
                conn.execute(statement)
                allowed = True
            except DENIED:
                allowed = False
            if allowed != declared(component, relation, privilege, column):
                what = f"{privilege} {relation}{'.' + column if column else ''}"
                wrong.append(f"{what}: {'allowed' if allowed else 'refused'}")
    assert len(tried) > 300
    assert not wrong, wrong


# -- row boundaries and the reproductions -------------------------------------------------------

FORGED_ROW = """
CREATE TEMP TABLE fake (id bigint, queue text, key text, status text, ordering_key text,
  ordering_waiting boolean, finished_at timestamptz, lease_expires_at timestamptz,
  started_at timestamptz, lease_token bigint, notify_done boolean, has_children boolean,
  pipeline_id bigint)
"""


@pytest.mark.parametrize(
    "function", ["jobs_on_status", "flow_on_enqueue", "flow_on_enqueue_ordered"]
)
@pytest.mark.parametrize("who", LOGINS)
def test_1_no_login_runs_the_owners_trigger_code_on_a_forged_row(
    roles: Roles, who: str, function: str
) -> None:
    """A trigger function's EXECUTE is checked only by CREATE TRIGGER, on a temp table of the
    caller's own; there it must be refused."""
    with login(roles, who) as conn:
        conn.execute(FORGED_ROW)
        with pytest.raises(DENIED):
            conn.execute(
                f"CREATE TRIGGER t AFTER UPDATE ON fake FOR EACH ROW"
                f" EXECUTE FUNCTION leaseq.{function}()"
            )


def test_2_a_worker_enqueues_nothing_through_the_scheduler(database_url: str, roles: Roles) -> None:
    spec = leaseq.ScheduleSpec("team-report", "0 * * * *", queue="reports", job_type="report")
    with leaseq.connect(database_url, action="test") as owner:
        leaseq.Schedules(owner).declare("team:registry", [spec])
    with login(roles, "worker") as conn:
        with pytest.raises(DENIED):
            conn.execute(
                "INSERT INTO leaseq.schedules (name, cron, queue, job_type, payload, declared_by,"
                " priority) VALUES ('x', '* * * * *', 'victimq', 'charge_card',"
                " '{\"amount\": 1000000}', 'code', -32768)"
            )
        with pytest.raises(DENIED):
            conn.execute("UPDATE leaseq.schedules SET queue = 'victimq'")
        with pytest.raises(DENIED, match="only code schedules"):
            conn.execute(
                "SELECT * FROM leaseq.schedule_put('x', '* * * * *', 'UTC', 'victimq', 'charge',"
                " '{}', 100, 5, 'skip', 0, 'runtime', NULL, now())"
            )
    with queue_as(roles, "worker") as w:
        # The team's schedule is another login's: a worker's declaration leaves it alone.
        hijack = leaseq.ScheduleSpec("team-report", "* * * * *", queue="victimq", job_type="x")
        leaseq.Schedules(w).declare("team:registry", [hijack])
        assert leaseq.Schedules(w).declare("team:registry", []) == []
    with psycopg.connect(database_url) as admin:
        row = admin.execute(
            "SELECT cron, queue, enabled FROM leaseq.schedules WHERE name = 'team-report'"
        ).fetchone()
    assert row == ("0 * * * *", "reports", True)


def test_3_a_producer_cannot_rewire_or_read_another_producers_pipeline(
    database_url: str, roles: Roles
) -> None:
    with queue_as(roles, "producer") as p:
        graph = leaseq.Graph("tenant-a")
        parent = graph.add("q", "split", name="split")
        graph.add("q", "merge", after=[parent], name="merge")
        ids = leaseq.Queue(p).enqueue_graph(graph)
    with queue_as(roles, "producer2") as p2:
        mine = leaseq.Queue(p2).enqueue("q", "t").job_id
    with login(roles, "producer2") as conn:
        with pytest.raises(DENIED):
            conn.execute(
                "INSERT INTO leaseq.job_deps (parent_id, child_id) VALUES (%s, %s)",
                [mine, ids["merge"]],
            )
        assert conn.execute("SELECT count(*) FROM leaseq.job_deps").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM leaseq.pipelines").fetchone() == (0,)
        changed = conn.execute("UPDATE leaseq.pipelines SET total = 0, finished_at = now()")
        assert changed.rowcount == 0
    with psycopg.connect(database_url) as admin:
        assert admin.execute("SELECT total, finished_at FROM leaseq.pipelines").fetchall() == [
            (2, None)
        ]


def test_4_a_worker_settles_only_what_it_holds_and_writes_no_effect_ahead(
    database_url: str, roles: Roles
) -> None:
    with queue_as(roles, "producer") as p:
        pending = leaseq.Queue(p).enqueue("q", "invoice", idempotency_key="invoice-99").job_id
    with login(roles, "worker") as conn:
        with pytest.raises(DENIED):
            conn.execute(
                "UPDATE leaseq.jobs SET status = 'succeeded', finished_at = now(),"
                ' result = \'{"receipt": "FORGED"}\' WHERE id = %s',
                [pending],
            )
        with pytest.raises(DENIED):
            conn.execute(
                "INSERT INTO leaseq.job_results (queue, job_type, idempotency_key, job_id,"
                " produced_by, produced_at, result) VALUES ('q', 'invoice', 'invoice-99', %s,"
                " 'w', now(), '{\"receipt\": \"FORGED\"}')",
                [pending],
            )
    with queue_as(roles, "worker") as w:
        [job] = leaseq.Queue(w).claim(["q"], "w1")
        leaseq.Queue(w).complete(job.lease, {"receipt": "real"})
        effect = leaseq.Queue(w).effect("invoice-99", queue="q", job_type="invoice")
    assert effect is not None and effect.result == {"receipt": "real"}


def test_4_a_worker_writes_steps_and_stream_items_only_of_a_job_it_holds(
    database_url: str, roles: Roles
) -> None:
    with queue_as(roles, "producer") as p:
        pending = leaseq.Queue(p).enqueue("q", "bill").job_id
    with login(roles, "worker") as conn:
        with pytest.raises(DENIED):
            conn.execute(
                "INSERT INTO leaseq.job_steps (job_id, name, attempt, lease_token, intended_at,"
                " finished_at, result) VALUES (%s, 'charge', 1, 0, now(), now(), '\"FORGED\"')",
                [pending],
            )
        with pytest.raises(DENIED):
            conn.execute(
                "INSERT INTO leaseq.job_stream (job_id, seq, value) VALUES (%s, 1, '1')",
                [pending],
            )
    with queue_as(roles, "worker") as w:
        [job] = leaseq.Queue(w).claim(["q"], "w1")
        ctx = JobContext(job, leaseq.Queue(w), "w1", threading.Event())
        assert ctx.step("charge", lambda: "real") == "real"
        assert ctx.emit("item") == 1
    # While the job runs, a step's row is written only at the job's current token.
    with login(roles, "worker") as conn, pytest.raises(DENIED):
        conn.execute(
            "UPDATE leaseq.job_steps SET result = '\"FORGED\"', lease_token = 99 WHERE job_id = %s",
            [pending],
        )
    with queue_as(roles, "producer") as p:
        assert [s.result for s in leaseq.Queue(p).steps(pending)] == ["real"]
        assert [i.value for i in leaseq.Queue(p).stream_page(pending).items] == ["item"]


def test_4_signals_reach_only_a_producers_own_jobs_and_a_held_jobs_worker(
    database_url: str, roles: Roles
) -> None:
    with queue_as(roles, "producer") as p:
        mine = leaseq.Queue(p).enqueue("q", "approve").job_id
        assert leaseq.Queue(p).signal(mine, "go", {"ok": 1}).stored
    with queue_as(roles, "producer2") as p2:
        theirs = leaseq.Queue(p2).enqueue("q", "approve").job_id
        # Another producer's job does not exist for it: through the API, the function...
        with pytest.raises(leaseq.JobStateError, match=f"job {mine} does not exist"):
            leaseq.Queue(p2).signal(mine, "go", "FORGED")
    with login(roles, "producer2") as conn:
        # ... or a direct insert (its row policy), and it reads none of its signals.
        with pytest.raises(DENIED):
            conn.execute(
                "INSERT INTO leaseq.job_signals (job_id, name, payload) VALUES (%s, 'x', '1')",
                [mine],
            )
        assert conn.execute("SELECT count(*) FROM leaseq.job_signals").fetchone() == (0,)
    # Its own job, but not in another's name.
    with login(roles, "producer") as conn, pytest.raises(DENIED):
        conn.execute(
            "INSERT INTO leaseq.job_signals (job_id, name, payload, sent_by)"
            " VALUES (%s, 'x', '1', 'ops')",
            [mine],
        )
    with login(roles, "worker") as conn:
        with pytest.raises(DENIED):
            conn.execute(
                "INSERT INTO leaseq.job_signals (job_id, name, payload) VALUES (%s, 'x', '1')",
                [theirs],
            )
        # The worker reads no signal directly: only a held job's, through lease_signal.
        with pytest.raises(DENIED):
            conn.execute("SELECT count(*) FROM leaseq.job_signals")
    with queue_as(roles, "worker") as w:
        [job] = leaseq.Queue(w).claim(["q"], "w1", limit=1)
        assert job.id == mine
        assert JobContext(job, leaseq.Queue(w), "w1", threading.Event()).wait_for(
            "go", timeout=60
        ) == {"ok": 1}


def test_4_only_the_operator_pauses_a_key_for_a_day_at_most_and_resumes_it(
    database_url: str, roles: Roles
) -> None:
    """A worker pauses only the key of a job it holds, by a back-off (lease_back_off, with
    the lease's secret): another tenant's key is not its to pause."""
    with queue_as(roles, "producer") as p:
        leaseq.Queue(p).enqueue("q", "t", key="tenant-a")
    with login(roles, "worker") as conn, pytest.raises(DENIED):
        conn.execute("SELECT leaseq.flow_pause('q', 'tenant-a', 'infinity')")
    with login(roles, "operator") as conn:
        until, now = conn.execute(
            "SELECT leaseq.flow_pause('q', 'tenant-a', 'infinity'), now()"
        ).fetchone()  # type: ignore[misc]
    assert isinstance(until, datetime) and isinstance(now, datetime)
    assert now < until <= now + timedelta(days=1)
    with queue_as(roles, "operator") as o:
        [key] = leaseq.FlowControl(o).status(["q"])
        assert key.paused_until == until
        assert leaseq.FlowControl(o).resume("q", "tenant-a") is True
        assert leaseq.FlowControl(o).status(["q"])[0].paused_until is None
        assert leaseq.FlowControl(o).resume("q", "tenant-a") is False


@pytest.mark.parametrize("run_at", ["-infinity", "infinity", "20000-01-01", "1900-01-01"])
def test_5_no_writer_stores_a_time_no_reader_can_read(roles: Roles, run_at: str) -> None:
    with login(roles, "producer") as conn:
        with pytest.raises(pg_errors.InvalidParameterValue, match="invalid run_at"):
            conn.execute("SELECT * FROM leaseq.enqueue('q', 't', run_at => %s)", [run_at])
        with pytest.raises(pg_errors.InvalidParameterValue, match="invalid run_at"):
            conn.execute(
                "INSERT INTO leaseq.jobs (queue, job_type, available_at) VALUES ('q', 't', %s)",
                [run_at],
            )
        assert conn.execute("SELECT count(*) FROM leaseq.jobs").fetchone() == (0,)


def test_5_a_back_off_from_a_garbage_retry_after_is_clamped_to_a_day(
    database_url: str, roles: Roles
) -> None:
    with queue_as(roles, "producer") as p:
        leaseq.Queue(p).enqueue("q", "t", key="tenant-a")
    with queue_as(roles, "worker") as w:
        queue = leaseq.Queue(w)
        [job] = queue.claim(["q"], "w1")
        queue.back_off(job.lease, 1e12)
    with psycopg.connect(database_url) as admin:
        available, paused, now = admin.execute(
            "SELECT j.available_at, k.paused_until, now() FROM leaseq.jobs j"
            " JOIN leaseq.flow_keys k ON k.queue = j.queue AND k.key = j.key"
        ).fetchone()  # type: ignore[misc]
    assert available <= now + timedelta(days=1) and paused <= now + timedelta(days=1)


@pytest.mark.parametrize(
    ("column", "value", "field"),
    [
        ("payload", Jsonb({"x": "a" * 2_000_000}), "payload"),
        # A number is a few bytes stored and 100,001 printed: measured as readers get it.
        ("payload", "[" + ", ".join(["1e100000"] * 11) + "]", "payload"),
        ("max_attempts", 2147483647, "max_attempts"),
        ("timeout", timedelta(days=4000), "timeout"),
        ("idempotency_key", "k" * 513, "idempotency_key"),
        ("dedup_key", "", "dedup_key"),
    ],
)
def test_6_a_producers_own_insert_gets_the_enqueues_checks(
    roles: Roles, column: str, value: object, field: str
) -> None:
    with login(roles, "producer") as conn, pytest.raises(pg_errors.InvalidParameterValue) as e:
        conn.execute(
            sql.SQL("INSERT INTO leaseq.jobs (queue, job_type, {}) VALUES ('q', 't', %s)").format(
                sql.Identifier(column)
            ),
            [value],
        )
    assert e.value.diag.column_name == field
    assert str(e.value).startswith(f"invalid {field}: ")


def test_the_api_refuses_the_same_bounds_in_the_same_words(conn: leaseq.core.db.Conn) -> None:
    queue = leaseq.Queue(conn)
    for kwargs, field in [
        ({"max_attempts": 1001}, "max_attempts"),
        ({"delay": 315_360_001}, "delay"),
        ({"timeout": 315_360_001}, "timeout"),
        ({"run_at": datetime(2100, 1, 1, tzinfo=UTC)}, "run_at"),
    ]:
        with pytest.raises(leaseq.InvalidJob) as refused:
            queue.enqueue("q", "t", **kwargs)  # type: ignore[arg-type]
        assert refused.value.field == field
    assert queue.jobs() == []


def test_a_worker_cannot_free_a_held_unit_of_a_limit(database_url: str, roles: Roles) -> None:
    with queue_as(roles, "operator") as o:
        leaseq.FlowControl(o).set_limit("q", "tenant-a", max_running=1)
    with queue_as(roles, "producer") as p:
        for _ in range(2):
            leaseq.Queue(p).enqueue("q", "t", key="tenant-a")
    with queue_as(roles, "worker") as w:
        assert len(leaseq.Queue(w).claim(["q"], "w1", limit=2)) == 1
    with login(roles, "worker") as conn:
        # A unit is taken only by a claim (lease_claim_keyed*), and given back only by its
        # job's transition: no worker login writes one, neither freed nor taken for a job
        # that does not exist.
        with pytest.raises(DENIED):
            conn.execute("UPDATE leaseq.flow_slots SET job_id = NULL, lease_token = NULL")
        with pytest.raises(DENIED):
            conn.execute("UPDATE leaseq.flow_slots SET job_id = -1 WHERE job_id IS NULL")
        with pytest.raises(DENIED):
            conn.execute("UPDATE leaseq.flow_buckets SET tokens = 1e9")
    with queue_as(roles, "worker") as w:
        assert leaseq.Queue(w).claim(["q"], "w2") == []


def test_a_worker_login_writes_only_its_own_registry_rows(database_url: str, roles: Roles) -> None:
    with psycopg.connect(database_url) as admin:
        admin.execute(
            "INSERT INTO leaseq.workers (worker_id, queues, concurrency) VALUES ('other', '{q}', 1)"
        )
    with login(roles, "worker") as conn:
        assert conn.execute("DELETE FROM leaseq.workers").rowcount == 0
        assert conn.execute("UPDATE leaseq.workers SET in_flight = 99").rowcount == 0
        assert conn.execute("SELECT count(*) FROM leaseq.workers").fetchone() == (1,)


def test_a_producer_cancels_no_other_producers_job_or_pipeline_by_any_function(
    database_url: str, roles: Roles
) -> None:
    """Producer B names producer A's job and pipeline to every cancelling function; nothing
    of A's changes. No other component's login may run the producer's functions."""
    with queue_as(roles, "producer") as p:
        g = leaseq.Graph("a's")
        first = g.add("q", "first", name="first")
        g.add("q", "second", name="second", after=[first])
        made = leaseq.Queue(p).enqueue_graph(g)
    job, pipeline = made["first"], made.pipeline_id
    tries = [
        ("SELECT * FROM leaseq.producer_cancel(%s, 'mine now')", job),
        ("SELECT * FROM leaseq.producer_cancel_pipeline(%s, 'mine now')", pipeline),
        ("SELECT * FROM leaseq.cancel_as_caller(%s, NULL, 'mine now', now())", job),
        ("SELECT * FROM leaseq.cancel_as_caller(NULL, %s, 'mine now', now())", pipeline),
        ("SELECT * FROM leaseq.cancel_jobs(ARRAY[%s]::bigint[], NULL, NULL, 'x', now())", job),
        ("SELECT * FROM leaseq.cancel_jobs('{}', %s, NULL, 'x', now(), NULL)", pipeline),
    ]
    with login(roles, "producer2") as conn:
        for statement, target in tries:
            with contextlib.suppress(DENIED):
                assert conn.execute(statement, [target]).fetchall() == [], statement
    for who in ("worker", "operator", "console"):
        with login(roles, who) as conn:
            for statement, target in tries[:2]:
                with pytest.raises(DENIED):
                    conn.execute(statement, [target])
    with psycopg.connect(database_url) as admin:
        statuses = admin.execute(
            "SELECT status::text FROM leaseq.jobs WHERE pipeline_id = %s ORDER BY id", [pipeline]
        ).fetchall()
    assert statuses == [("pending",), ("waiting",)]
    with queue_as(roles, "producer") as p:
        assert leaseq.Queue(p).cancel_pipeline(pipeline, reason="mine").cancelled == 2


def test_a_worker_spawns_only_through_its_door_for_a_job_it_holds(
    database_url: str, roles: Roles
) -> None:
    """A worker login writes no job, edge or pipeline and marks no parent itself, not even
    while it holds a job (so it cannot lock a job's row either); a fan-out goes through
    lease_spawn_lock and lease_spawn, which a second worker login holding the real token
    (not the secret) gets nothing from; and the holder's fan-out is its producer's, waiting
    for no other producer's job."""
    producer = roles.names["producer"]
    with queue_as(roles, "producer") as p:
        leaseq.Queue(p).enqueue("q", "t")
    with queue_as(roles, "producer2") as b:
        theirs = leaseq.Queue(b).enqueue("elsewhere", "t").job_id
    with queue_as(roles, "worker") as w:
        (held,) = leaseq.Queue(w).claim(["q"], "w1")
    with psycopg.connect(database_url) as admin:
        (pipeline,) = admin.execute(
            "INSERT INTO leaseq.pipelines (name, total, created_by) VALUES ('p', 0, %s)"
            " RETURNING id",
            [producer],
        ).fetchone()  # type: ignore[misc]
    direct = [
        ("INSERT INTO leaseq.jobs (queue, job_type, status, pipeline_id, enqueued_by)"
         " VALUES ('q', 'spawned', 'pending', %s, %s)", [pipeline, producer]),
        ("INSERT INTO leaseq.pipelines (name, total, created_by) VALUES ('mine', 1, %s)",
         [producer]),
        ("INSERT INTO leaseq.job_deps (parent_id, child_id) VALUES (%s, %s)", [held.id, theirs]),
        ("UPDATE leaseq.jobs SET has_children = true WHERE id = %s", [theirs]),
        ("UPDATE leaseq.pipelines SET total = total + 1 WHERE id = %s", [pipeline]),
        ("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", [held.id]),
    ]  # fmt: skip
    with login(roles, "worker") as conn:
        for statement, params in direct:
            with pytest.raises(DENIED):
                conn.execute(statement, params)
    lease = held.lease
    with login(roles, "worker2") as other:
        for secret in (b"", hashlib.sha256(b"guess").digest()):
            assert (
                other.execute(
                    "SELECT * FROM leaseq.lease_spawn_lock(%s, %s, %s, %s, %s, NULL)",
                    [lease.job_id, lease.owner, lease.token, secret, [theirs]],
                ).fetchall()
                == []
            )
            assert (
                other.execute(
                    "SELECT * FROM leaseq.lease_spawn(%s, %s, %s, %s, 'forged', '{q}', '{t}',"
                    " ARRAY['{}'::jsonb], '{1}', '{1}', ARRAY[NULL::timestamptz], '{0}', '{NULL}',"
                    " '{NULL}', '{0}', '{f}', '{NULL}', '{f}', '{}', '{}', '{}', '{}', NULL)",
                    [lease.job_id, lease.owner, lease.token, secret],
                ).fetchall()
                == []
            )
    with psycopg.connect(database_url) as admin:
        assert admin.execute(
            "SELECT count(*) FILTER (WHERE has_children), count(*) FROM leaseq.jobs"
        ).fetchone() == (0, 2)
    across = leaseq.Graph("reach")
    across.add("q", "merge", after=[theirs], name="merge")
    own = leaseq.Graph("own")
    own.add("q", "child", name="child")
    with queue_as(roles, "worker") as w:
        with pytest.raises(leaseq.InvalidGraph, match=f"parent job {theirs}"):
            leaseq.Queue(w).complete_many([lease], spawns=[across])
        (done,) = leaseq.Queue(w).complete_many([lease], spawns=[own])
    assert isinstance(done, leaseq.Completed)
    with psycopg.connect(database_url) as admin:
        assert admin.execute(
            "SELECT j.job_type, j.enqueued_by::text, p.created_by::text, j.has_children"
            "  FROM leaseq.jobs j JOIN leaseq.pipelines p ON p.id = j.pipeline_id"
            " WHERE j.job_type = 'child'"
        ).fetchall() == [("child", producer, producer, False)]
        assert admin.execute(
            "SELECT has_children FROM leaseq.jobs WHERE id = %s", [theirs]
        ).fetchone() == (False,)


# -- two logins of the worker role (issue 59): worker A against worker B's lease ----------------
#
# Worker A ("worker2") reads what any worker login reads: the real owner, token and digest of
# the job worker B ("worker") holds, and its claim's id. It tries every write a running
# attempt makes, directly and through the worker's door (the lease_* functions). Each must
# be refused, and B's handler must then run, record and complete as if A were not there.


def held_by_b(roles: Roles) -> tuple[leaseq.ClaimedJob, tuple[str, int, bytes]]:
    """A job of producer's that worker B holds, and what worker A reads of its lease."""
    with queue_as(roles, "producer") as p:
        leaseq.Queue(p).enqueue("q", "bill", idempotency_key="invoice-99")
    with queue_as(roles, "worker") as w:
        [job] = leaseq.Queue(w).claim(["q"], "worker-b")
    with login(roles, "worker2") as a:
        row = a.execute(
            "SELECT lease_owner, lease_token, lease_digest FROM leaseq.jobs WHERE id = %s",
            [job.id],
        ).fetchone()
    assert row is not None and row[1] == job.lease.token
    return job, (str(row[0]), int(str(row[1])), bytes(row[2]))  # type: ignore[arg-type]


DIRECT_FORGERIES = [
    "INSERT INTO leaseq.job_steps (job_id, name, attempt, lease_token, intended_at, finished_at,"
    " result) VALUES (%(id)s, 'refund', 1, %(token)s, now(), now(), '{\"note\": \"FORGED\"}')",
    "UPDATE leaseq.job_steps SET lease_token = NULL, result = NULL WHERE job_id = %(id)s",
    "INSERT INTO leaseq.job_stream (job_id, seq, value) VALUES (%(id)s, 10000, '\"FORGED\"')",
    "INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, outcome)"
    " VALUES (%(id)s, 1, %(token)s, 'worker-a', now(), 'fenced')",
    "INSERT INTO leaseq.job_results (queue, job_type, idempotency_key, job_id, produced_by,"
    " produced_at, result) VALUES ('q', 'bill', 'invoice-99', %(id)s, 'worker-a', now(), '1')",
    "UPDATE leaseq.jobs SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL,"
    ' result = \'{"paid": "FORGED"}\' WHERE id = %(id)s AND lease_token = %(token)s',
    "UPDATE leaseq.jobs SET lease_expires_at = 'infinity' WHERE id = %(id)s",
    "UPDATE leaseq.jobs SET lease_digest = sha256('mine') WHERE id = %(id)s",
    "SELECT payload FROM leaseq.job_signals WHERE job_id = %(id)s",
]


@pytest.mark.parametrize("statement", DIRECT_FORGERIES)
def test_7_a_worker_writes_nothing_of_another_workers_lease_directly(
    database_url: str, roles: Roles, statement: str
) -> None:
    job, (_, token, _) = held_by_b(roles)
    with login(roles, "worker2") as a, pytest.raises(DENIED):
        a.execute(statement, {"id": job.id, "token": token})
    b_completes_as_if_alone(database_url, roles, job)


def b_completes_as_if_alone(database_url: str, roles: Roles, job: leaseq.ClaimedJob) -> None:
    """Worker B's handler runs its steps (their functions run), emits from offset 1, and
    completes with its effect; nothing of A's is in the job's tables."""
    ran: list[str] = []
    with queue_as(roles, "worker") as w:
        ctx = JobContext(job, leaseq.Queue(w), "worker-b", threading.Event())
        assert ctx.step("charge", lambda: ran.append("charge") or {"charged": 1}) == {"charged": 1}
        assert ctx.step("refund", lambda: ran.append("refund") or {"refunded": True}) == {
            "refunded": True
        }
        assert ctx.emit("page-1") == 1
        done = leaseq.Queue(w).complete(job.lease, {"paid": "real"})
    assert ran == ["charge", "refund"]
    assert isinstance(done, leaseq.Completed) and done.effect_written
    with psycopg.connect(database_url) as admin:
        found = admin.execute(
            "SELECT (SELECT result FROM leaseq.jobs WHERE id = %(id)s),"
            " (SELECT array_agg(worker || ':' || outcome ORDER BY lease_token)"
            "    FROM leaseq.job_attempts WHERE job_id = %(id)s),"
            " (SELECT result FROM leaseq.job_results WHERE idempotency_key = 'invoice-99'),"
            " (SELECT count(*) FROM leaseq.job_stream WHERE job_id = %(id)s)",
            {"id": job.id},
        ).fetchone()
    assert found == ({"paid": "real"}, ["worker-b:succeeded"], {"paid": "real"}, 1)


DOOR = {
    "lease_heartbeat_many": "SELECT * FROM leaseq.lease_heartbeat_many(ARRAY[%(id)s::bigint],"
    " ARRAY[%(owner)s], ARRAY[%(token)s::bigint], ARRAY[%(secret)s::bytea],"
    " ARRAY['\"FORGED\"'::jsonb], 86400, NULL)",
    "lease_complete": "SELECT * FROM leaseq.lease_complete(ARRAY[%(id)s::bigint],"
    " ARRAY[%(owner)s], ARRAY[%(token)s::bigint], ARRAY[%(secret)s::bytea],"
    " ARRAY['{\"paid\": \"FORGED\"}'::jsonb], ARRAY['invoice-99'], NULL, NULL, NULL)",
    "lease_fail": "SELECT * FROM leaseq.lease_fail(%(id)s, %(owner)s, %(token)s, %(secret)s,"
    " 'FORGED', NULL, NULL, false, 'failed', 1, 2, NULL)",
    "lease_release": "SELECT * FROM leaseq.lease_release(%(id)s, %(owner)s, %(token)s,"
    " %(secret)s, now(), 'FORGED', true, 1, 2, NULL)",
    "lease_sleep": "SELECT * FROM leaseq.lease_sleep(%(id)s, %(owner)s, %(token)s, %(secret)s,"
    " now(), now() + interval '1 day', NULL)",
    "lease_refused": "SELECT * FROM leaseq.lease_refused(%(id)s, %(owner)s, %(token)s,"
    " %(secret)s, 1, now(), 'complete', NULL)",
    "lease_step_intend": "SELECT * FROM leaseq.lease_step_intend(%(id)s, %(owner)s, %(token)s,"
    " %(secret)s, 'refund', NULL, NULL)",
    "lease_emit": "SELECT * FROM leaseq.lease_emit(%(id)s, %(owner)s, %(token)s, %(secret)s,"
    " '\"FORGED\"', 2147483647, NULL)",
    "lease_signal": "SELECT * FROM leaseq.lease_signal(%(id)s, %(owner)s, %(token)s, %(secret)s,"
    " 'approval', NULL)",
}


@pytest.mark.parametrize("secret", ["digest", "guess"])
@pytest.mark.parametrize("function", sorted(DOOR))
def test_7_the_door_takes_another_workers_token_for_nothing(
    database_url: str, roles: Roles, function: str, secret: str
) -> None:
    """With B's real owner and token, and for secret the digest A can read or one it made
    up, each function answers as for a lease not held and writes nothing."""
    job, (owner, token, digest) = held_by_b(roles)
    params = {
        "id": job.id,
        "owner": owner,
        "token": token,
        "secret": digest if secret == "digest" else bytes(32),
    }
    with login(roles, "worker2") as a:
        rows = a.execute(DOOR[function], params).fetchall()
    # The refusal record answers with the job's status and records nothing; an emit says
    # the lease is not held.
    refused = {"lease_refused": [("running", 0)], "lease_emit": [(False, None)]}
    assert rows == refused.get(function, [])
    b_completes_as_if_alone(database_url, roles, job)


def test_7_a_worker_takes_no_lease_of_another_through_the_api(
    database_url: str, roles: Roles
) -> None:
    """leaseq's own worker API with B's real owner and token: every call is fenced."""
    job, (owner, token, _) = held_by_b(roles)
    forged = dataclasses.replace(job.lease, owner=owner, token=token, secret=bytes(32))
    with queue_as(roles, "worker2") as a:
        q = leaseq.Queue(a)
        assert q.heartbeat(forged).status is leaseq.HeartbeatStatus.LOST
        assert q.step_intend(forged, "refund", seen_token=None) is False
        assert q.emit(forged, "FORGED") is None
        assert isinstance(q.complete(forged, {"paid": "FORGED"}), leaseq.Fenced)
        assert isinstance(q.release(forged), leaseq.Fenced)
    b_completes_as_if_alone(database_url, roles, job)


def test_7_a_worker_clock_does_not_revive_an_expired_lease(database_url: str, roles: Roles) -> None:
    """The door's `now` is the owner's test hook: a worker login passing an early one is
    held to database time, so its own lease, once expired, stays expired."""
    with queue_as(roles, "producer") as p:
        leaseq.Queue(p).enqueue("q", "bill")
    with queue_as(roles, "worker") as w:
        [job] = leaseq.Queue(w).claim(["q"], "worker-b", lease_seconds=0.05)
    with psycopg.connect(database_url, autocommit=True) as admin:
        wait_for(
            lambda: (
                admin.execute(
                    "SELECT lease_expires_at < now() FROM leaseq.jobs WHERE id = %s", [job.id]
                ).fetchone()
                == (True,)
            ),
            "the lease to expire in database time",
        )
    with queue_as(roles, "worker") as w:
        early = job.lease.started_at
        answer = leaseq.Queue(w).complete(job.lease, {"late": True}, now=early)
    assert isinstance(answer, leaseq.Fenced)


def test_7_a_worker_leases_a_job_only_as_the_claims_lease_it(roles: Roles) -> None:
    """A worker login updates no lease column itself: no claim with an endless lease, its
    own digest or a token of its choosing, and no pending job taken around the claims."""
    with queue_as(roles, "producer") as p:
        pending = leaseq.Queue(p).enqueue("q", "bill").job_id
    with login(roles, "worker2") as a, pytest.raises(DENIED):
        a.execute(
            "UPDATE leaseq.jobs SET status = 'running', lease_owner = 'worker-a',"
            " lease_token = lease_token + 1, attempt_count = attempt_count + 1,"
            " started_at = now(), lease_expires_at = 'infinity',"
            " lease_digest = sha256('mine') WHERE id = %s",
            [pending],
        )
    with queue_as(roles, "worker2") as a:
        [job] = leaseq.Queue(a).claim(["q"], "worker-a", lease_seconds=30)
    assert job.id == pending
    assert (job.lease_expires_at - job.lease.started_at).total_seconds() <= 30


# -- two logins of the producer role: producer B against producer A's pipeline -------------------


def test_8_a_producer_puts_no_job_in_another_producers_pipeline(
    database_url: str, roles: Roles
) -> None:
    """Producer B guesses A's pipeline id (they are sequential) and puts a job of its own
    there; a worker login marks A's pipeline finished. Both are refused, and A's pipeline
    still waits for its last job (issue 59, finding 4: both attacks worked on d3f86a6)."""
    with queue_as(roles, "producer") as p:
        graph = leaseq.Graph("tenant-a")
        parent = graph.add("q", "split", name="split")
        graph.add("q", "merge", after=[parent], name="merge")
        theirs = leaseq.Queue(p).enqueue_graph(graph).pipeline_id
    assert theirs is not None
    with login(roles, "producer2") as b, pytest.raises(DENIED):
        b.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, status, pipeline_id)"
            " VALUES ('q', 'forged', 'pending', %s)",
            [theirs],
        )
    with login(roles, "worker") as w, pytest.raises(DENIED):
        w.execute("UPDATE leaseq.pipelines SET finished_at = now() WHERE id = %s", [theirs])
    with queue_as(roles, "producer") as p:
        record = leaseq.Queue(p).pipeline(theirs)
        assert (record.total, record.finished_at) == (2, None)
    with queue_as(roles, "producer2") as b:
        own = leaseq.Graph("tenant-b")
        own.add("q", "t", name="only")
        assert leaseq.Queue(b).enqueue_graph(own).pipeline_id not in (None, theirs)


# -- two teams (issue 59, part 3): a queue given to one team's roles -----------------------------


@dataclasses.dataclass(frozen=True)
class Teams:
    """Two teams' logins, each a member of a component role (worker or producer) and of its
    team's role: ``urls["a-worker"]``, ``urls["b-producer"]``..."""

    urls: dict[str, str]


@contextlib.contextmanager
def two_teams(database_url: str, roles: Roles) -> Iterator[Teams]:
    """Teams A and B, each with a worker and a producer login holding exactly the component
    roles' rights, and a team role; queue "a-q" is given to A's team role for both uses,
    "b-q" to B's, "open-q" to nobody. Dropped afterwards (roles are cluster-wide)."""
    tag = roles.names["worker"].rsplit("_", 1)[0]
    made: list[str] = []
    urls = {}
    try:
        with psycopg.connect(database_url, autocommit=True) as admin:
            for team in ("a", "b"):
                team_role = f"{tag}_team_{team}"
                admin.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(team_role)))
                made.append(team_role)
                for component in ("worker", "producer"):
                    name = f"{tag}_{team}_{component}"
                    admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}, {}").format(
                        sql.Identifier(name), sql.Identifier(roles.names[component]),
                        sql.Identifier(team_role)))  # fmt: skip
                    made.append(name)
                    urls[f"{team}-{component}"] = make_conninfo(database_url, user=name)
        with leaseq.connect(database_url, action="test") as owner:
            given = leaseq.QueueRoles(owner)
            for team in ("a", "b"):
                for use in leaseq.QueueUse:
                    role = f"{tag}_team_{team}"
                    assert given.give(f"{team}-q", use, [role]) == [role]
        yield Teams(urls)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("DELETE FROM leaseq.queue_roles")
            for name in reversed(made):
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def as_team(teams: Teams, who: str) -> leaseq.core.db.Conn:
    return leaseq.connect(teams.urls[who], action="test")


def test_9_a_queue_given_to_one_teams_roles_is_closed_to_the_other(
    database_url: str, roles: Roles
) -> None:
    """Team B's logins, with the component roles' full rights, cannot enqueue into, claim
    from, schedule into or fan out into team A's queue, by the API or by SQL; each team
    still uses its own queue and the queue given to nobody (issue 59, finding 2 and part 3:
    on d3f86a6 a worker login declared a code schedule into any queue)."""
    with two_teams(database_url, roles) as teams:
        with as_team(teams, "a-producer") as a, as_team(teams, "b-producer") as b:
            mine = leaseq.Queue(a).enqueue("a-q", "t").job_id
            leaseq.Queue(a).enqueue("open-q", "t")
            with pytest.raises(leaseq.PermissionDenied):
                leaseq.Queue(b).enqueue("a-q", "forged")
            graph = leaseq.Graph("into-a")
            graph.add("a-q", "forged", name="n")
            with pytest.raises(leaseq.PermissionDenied):
                leaseq.Queue(b).enqueue_graph(graph)
            theirs = leaseq.Queue(b).enqueue("b-q", "t").job_id
        with (
            psycopg.connect(teams.urls["b-producer"], autocommit=True) as b_sql,
            pytest.raises(DENIED),
        ):
            b_sql.execute("SELECT * FROM leaseq.enqueue('a-q', 'forged')")
        with psycopg.connect(teams.urls["b-worker"], autocommit=True) as w2:
            assert (
                w2.execute(
                    "SELECT id FROM leaseq.lease_claim('{a-q}', NULL, 'w2', 10, 30,"
                    " gen_random_uuid(), %s, NULL)",
                    [hashlib.sha256(b"mine").digest()],
                ).fetchall()
                == []
            )
            with pytest.raises(DENIED, match="a-q"):
                w2.execute(
                    "SELECT * FROM leaseq.schedule_put('x', '* * * * *', 'UTC', 'a-q', 'charge',"
                    " '{}', 100, 5, 'skip', 0, 'code', NULL, now())"
                )
        with as_team(teams, "b-worker") as w2:
            claimed = leaseq.Queue(w2).claim(["a-q", "b-q", "open-q"], "w2", limit=10)
            assert sorted(j.queue for j in claimed) == ["b-q", "open-q"]
            assert theirs in {j.id for j in claimed}
            # Finding 3: B's handler writes the effect key A's job will use, first; it lands
            # in B's own queue, and A's effect is still A's to write.
            (b_job,) = (j for j in claimed if j.id == theirs)
            forged = leaseq.Queue(w2).complete(b_job.lease, {"forged": True}, effect_key="inv-99")
            assert isinstance(forged, leaseq.Completed) and forged.effect_written
        with as_team(teams, "a-worker") as w:
            (held,) = leaseq.Queue(w).claim(["a-q", "b-q"], "w1", limit=10)
            assert held.id == mine
            across = leaseq.Graph("into-b")
            across.add("b-q", "forged", name="n")
            with pytest.raises(leaseq.PermissionDenied, match="b-q"):
                leaseq.Queue(w).complete_many([held.lease], spawns=[across])
            own = leaseq.Graph("own")
            own.add("a-q", "child", name="n")
            (done,) = leaseq.Queue(w).complete_many(
                [held.lease], [{"paid": True}], effect_keys=["inv-99"], spawns=[own]
            )
            assert isinstance(done, leaseq.Completed) and done.effect_written
        with psycopg.connect(database_url) as admin:
            assert admin.execute(
                "SELECT queue, job_type, count(*) FROM leaseq.jobs GROUP BY 1, 2 ORDER BY 1, 2"
            ).fetchall() == [("a-q", "child", 1), ("a-q", "t", 1), ("b-q", "t", 1),
                             ("open-q", "t", 1)]  # fmt: skip
            assert admin.execute("SELECT count(*) FROM leaseq.schedules").fetchone() == (0,)


def test_a_worker_login_registers_a_bounded_number_of_workers(
    database_url: str, roles: Roles
) -> None:
    """Issue 59: a worker login registered 50,000 fake workers. One statement that would
    leave it more than 10,000 is refused whole (a per-row check would see the table as it
    was before the statement); its real registrations go on."""
    fake = (
        "INSERT INTO leaseq.workers (worker_id, queues, concurrency)"
        " SELECT 'fake-' || g, '{q}', 1 FROM generate_series(1, %s) g"
    )
    with login(roles, "worker") as w:
        with pytest.raises(pg_errors.ProgramLimitExceeded, match="at most 10000"):
            w.execute(fake, [10_001])
        assert w.execute("SELECT count(*) FROM leaseq.workers").fetchone() == (0,)
        w.execute(fake, [10_000])
        with pytest.raises(pg_errors.ProgramLimitExceeded):
            w.execute(fake.replace("'fake-'", "'more-'"), [1])
    with login(roles, "worker2") as other:
        other.execute(fake.replace("'fake-'", "'mine-'"), [1])  # another login's own budget


def test_a_worker_login_cannot_make_its_lease_outlive_a_day(
    database_url: str, roles: Roles
) -> None:
    """Issue 59: a worker could set its lease never to expire (a job without a timeout,
    renewed with a huge lease_seconds), so a dead worker's job never came back. A claim and a
    renewal take at most a day, whatever the caller asks; the API refuses more by name."""
    with queue_as(roles, "producer") as p:
        leaseq.Queue(p).enqueue("q", "t")
    with queue_as(roles, "worker") as w, pytest.raises(leaseq.InvalidJob, match="lease_seconds"):
        leaseq.Queue(w).claim(["q"], "w1", lease_seconds=86_401)
    with login(roles, "worker") as w:
        secret = hashlib.sha256(b"mine").digest()
        (job_id, token) = w.execute(
            "SELECT id, lease_token FROM leaseq.lease_claim('{q}', NULL, 'w1', 1, 1e9,"
            " gen_random_uuid(), %s, NULL)",
            [secret],
        ).fetchone()  # type: ignore[misc]
        renewed = w.execute(
            "SELECT lease_expires_at - now() FROM leaseq.lease_heartbeat_many(%s, '{w1}', %s, %s,"
            " '{NULL}', 1e9, NULL)",
            [[job_id], [token], [secret]],
        ).fetchone()
    assert renewed is not None and renewed[0] <= timedelta(days=1)
    with psycopg.connect(database_url) as admin:
        (left,) = admin.execute(
            "SELECT lease_expires_at - now() FROM leaseq.jobs WHERE id = %s", [job_id]
        ).fetchone()  # type: ignore[misc]
    assert left <= timedelta(days=1)
