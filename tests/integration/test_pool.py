"""leaseq's pool hands out checked connections and reconnects in the caller's thread."""

from __future__ import annotations

import leaseq
from support.polling import wait_for


def _alive(conn: leaseq.core.db.Conn, pid: int) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return bool(row and row[0])


def test_a_killed_idle_connection_is_never_handed_out(
    database_url: str, conn: leaseq.core.db.Conn
) -> None:
    """A backend killed while its connection sat idle in the pool (pg_terminate_backend, a
    pooler restart, an idle timeout): the next caller gets a working connection."""
    with leaseq.open_pool(database_url, min_size=1, max_size=1, timeout=5) as pool:
        for _ in range(3):
            with pool.connection() as pooled:
                row = pooled.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                pid = int(row[0])
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])
            wait_for(lambda: not _alive(conn, pid), "the backend to go")  # noqa: B023
            with pool.connection() as pooled:
                assert pooled.execute("SELECT 1").fetchone() == (1,)


def test_a_connection_given_back_in_a_transaction_is_not_reused(database_url: str) -> None:
    with leaseq.open_pool(database_url, min_size=0, max_size=1, timeout=5) as pool:
        with pool.connection() as pooled:
            pooled.execute("BEGIN")
            pooled.execute("CREATE TEMP TABLE left_open (x int)")
        with pool.connection() as pooled:
            assert pooled.info.transaction_status.name == "IDLE"
            assert pooled.execute("SELECT to_regclass('pg_temp.left_open')").fetchone() == (None,)
