"""Why a connection failed, said once and plainly: a refused login, a missing database or an
unreachable server, each with what to do, never with the password; through a pool too, and
without waiting out the pool's timeout when waiting cannot help."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import leaseq
from leaseq.cli.main import main
from leaseq.demo.embedded import EmbeddedPostgres

PASSWORD = "right-horse-battery"  # the test server's own
WRONG = "Wrong-Secret-4711"


@pytest.fixture(scope="module")
def password_url() -> Iterator[str]:
    """A private PostgreSQL that requires a password (scram-sha-256) for every connection."""
    server = EmbeddedPostgres()
    try:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute(f"ALTER ROLE postgres PASSWORD '{PASSWORD}'")
            hba = Path(admin.execute("SHOW hba_file").fetchone()[0])  # type: ignore[index]
            hba.write_text("local all all scram-sha-256\nhost all all all scram-sha-256\n")
            admin.execute("SELECT pg_reload_conf()")
        yield make_conninfo(server.url, password=PASSWORD)
    finally:
        server.stop()


def _with(url: str, **changes: str) -> str:
    return make_conninfo(url, **changes)


def test_a_wrong_password_is_reported_as_a_refused_login(password_url: str) -> None:
    with psycopg.connect(password_url):
        pass  # the right password works
    with pytest.raises(leaseq.AuthenticationFailed) as caught:
        leaseq.connect(_with(password_url, password=WRONG), action="enqueue")
    message = str(caught.value)
    assert "authentication failed" in message and "unreachable" not in message
    assert "nothing was enqueued" in message and "password in the database URL" in message
    assert WRONG not in message and PASSWORD not in message


def test_a_missing_database_is_named(server_url: str) -> None:
    url = _with(server_url, dbname="leaseq_no_such_db")
    with pytest.raises(leaseq.DatabaseMissing) as caught:
        leaseq.connect(url, action="migrate")
    message = str(caught.value)
    assert 'database "leaseq_no_such_db" does not exist' in message
    assert "createdb" in message and "no migration was applied" in message
    assert "unreachable" not in message


@pytest.mark.parametrize("problem", ["password", "database"])
def test_through_a_pool_the_cause_arrives_without_waiting_out_the_timeout(
    problem: str, password_url: str
) -> None:
    url = _with(password_url, password=WRONG) if problem == "password" else password_url
    if problem == "database":
        url = _with(url, dbname="leaseq_no_such_db")
    expected = leaseq.AuthenticationFailed if problem == "password" else leaseq.DatabaseMissing
    # Waiting out the timeout would end in a plain DatabaseUnavailable, without the cause.
    pool = leaseq.open_pool(url, timeout=30)
    try:
        with pytest.raises(expected) as caught:
            leaseq.Queue(pool).enqueue("q", "t")
    finally:
        pool.close()
    assert "nothing was enqueued" in str(caught.value)
    assert WRONG not in str(caught.value)


def test_through_a_pool_an_unreachable_server_says_so_after_the_timeout() -> None:
    pool = leaseq.open_pool("postgresql://leaseq@127.0.0.1:1/db?connect_timeout=2", timeout=1)
    try:
        with pytest.raises(leaseq.DatabaseUnavailable) as caught:
            leaseq.Queue(pool).stats()
    finally:
        pool.close()
    assert type(caught.value) is leaseq.DatabaseUnavailable
    assert "Connection refused" in str(caught.value)  # the cause, not only "timed out"


def test_the_cli_says_why_and_never_prints_the_password(
    password_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = _with(password_url, password=WRONG)
    assert conninfo_to_dict(wrong)["password"] == WRONG
    assert main(["status", "--database-url", wrong]) == 2
    captured = capsys.readouterr()
    assert "authentication failed" in captured.err
    assert WRONG not in captured.err + captured.out


def test_a_commit_that_fails_on_a_plain_connection_is_a_leaseq_error(database_url: str) -> None:
    """The server goes away between the last statement and COMMIT: the caller gets
    DatabaseUnavailable, not psycopg's AdminShutdown."""

    def work_then_lose_the_server(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        with leaseq.core.db.transaction(conn, "test commit") as c:
            c.execute("SELECT 1")
            admin.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])

    with (
        psycopg.connect(database_url, autocommit=True) as admin,
        psycopg.connect(database_url, autocommit=True) as conn,
        pytest.raises(leaseq.DatabaseUnavailable),
    ):
        work_then_lose_the_server(conn)
