"""Churn leaves dead entries at the head of the claim index, and keys that go idle at the head
of the keyed claim's turn order; Queue.vacuum clears both."""

from __future__ import annotations

import logging

import pytest

import leaseq
from bench.explain import function_plans
from leaseq.core._store import statements
from support.roles import login_roles


def claim_buffers(conn: leaseq.core.db.Conn, statement: str = "job_claim") -> int:
    """Shared buffers one claim touches (rolled back, so the backlog stays as it is)."""
    params = {
        "queues": ["q"],
        "owner": "probe",
        "limit": 1,
        "lease_seconds": 30,
        "claim_id": None,
        "claim_secret": b"s" * 32,
        "job_types": None,
        "now": None,
    }
    with conn.transaction(force_rollback=True):
        [plan] = function_plans(conn, statements.load()[statement].query, params, analyze=True)
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_vacuum_keeps_the_claim_cheap_under_churn(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue_many([leaseq.JobSpec("q", "t") for _ in range(100)])
    conn.execute("VACUUM leaseq.jobs")
    fresh = claim_buffers(conn)
    # 20,000 jobs through their life ahead of the backlog, in bulk for speed: each leaves a
    # dead entry in the claim index, exactly as claim + complete do one by one.
    conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type, available_at)"
        " SELECT 'q', 't', now() - interval '1 hour' FROM generate_series(1, 20000)"
    )
    conn.execute(
        "UPDATE leaseq.jobs SET status = 'succeeded', finished_at = now(), lease_owner = 'w'"
        " WHERE available_at < now() - interval '30 minutes'"
    )
    churned = claim_buffers(conn)
    assert churned > 2 * fresh  # the dead head this test is about (it can be measured)
    conn.execute("SELECT pg_stat_force_next_flush()")
    assert queue.vacuum(min_dead_tuples=10**9) is None  # below the threshold: nothing done
    dead = queue.vacuum(min_dead_tuples=1000)
    assert dead is not None
    assert dead >= 20000
    assert claim_buffers(conn) <= fresh + 2


def test_vacuum_keeps_the_keyed_claim_cheap_when_keys_go_idle(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue_many([leaseq.JobSpec("q", "t", key="z-live") for _ in range(10)])
    conn.execute("VACUUM leaseq.flow_keys")
    fresh = claim_buffers(conn, "job_claim_keyed")
    # 20,000 keys that had work and went idle, ahead of the live key in turn order (the same
    # virtual time; their names sort first): in bulk, as releases of their last jobs do one
    # by one. Each leaves a dead entry in the turn index.
    conn.execute(
        "INSERT INTO leaseq.flow_keys (queue, key, vtime, active)"
        " SELECT 'q', 'a' || g, 0, true FROM generate_series(1, 20000) g"
    )
    conn.execute("UPDATE leaseq.flow_keys SET active = false WHERE key LIKE 'a%'")
    churned = claim_buffers(conn, "job_claim_keyed")
    assert churned > 2 * fresh  # the dead head this test is about (it can be measured)
    conn.execute("SELECT pg_stat_force_next_flush()")
    dead = queue.vacuum(min_dead_tuples=1000)
    assert dead is not None
    assert dead >= 20000
    assert claim_buffers(conn, "job_claim_keyed") <= fresh + 2


def test_a_role_that_may_not_vacuum_says_so_once_and_reports_nothing(
    database_url: str, conn: leaseq.core.db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL only warns when a role may not VACUUM a table, and skips it: the leader
    logged "vacuumed leaseq.jobs" at every pass while nothing was vacuumed (an operator role
    on PostgreSQL 15, which has no MAINTAIN). The worker's role may not on any version; the
    operator's may from PostgreSQL 17 (migrate grants it MAINTAIN)."""
    with login_roles(database_url) as roles:
        names = roles.names
        leaseq.migrate(
            conn, leaseq.ComponentRoles(names["worker"], names["operator"], names["producer"])
        )
        conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, status, finished_at, lease_owner)"
            " SELECT 'q', 't', 'succeeded', now(), 'w' FROM generate_series(1, 5000)"
        )
        conn.execute("DELETE FROM leaseq.jobs")
        conn.execute("SELECT pg_stat_force_next_flush()")
        maintain = conn.info.server_version >= 170000
        for component, may in (("worker", False), ("operator", maintain)):
            with leaseq.connect(roles.urls[component], action="test") as as_role:
                queue = leaseq.Queue(as_role)
                caplog.clear()
                with caplog.at_level(logging.INFO, logger="leaseq.queue"):
                    first = queue.vacuum(min_dead_tuples=1000)
                    second = queue.vacuum(min_dead_tuples=1000)
            said = [(r.levelno, r.getMessage()) for r in caplog.records]
            if may:
                assert first is not None and first >= 5000, said
                assert [m for _, m in said if "cannot VACUUM" in m] == [], said
                continue
            assert (first, second) == (None, None), said
            warned = [m for level, m in said if level == logging.WARNING]
            assert len(warned) == 1, said  # once, not at every pass
            assert f"cannot VACUUM leaseq.jobs as role {names[component]}" in warned[0]
            assert not [m for _, m in said if m.startswith("vacuumed")], said
            (dead,) = conn.execute(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'leaseq.jobs'::regclass"
            ).fetchone()  # type: ignore[misc]
            assert dead >= 5000  # PostgreSQL did not vacuum it either
