"""`leaseq queues give/show`: a queue given to roles, and opened again, against a real
database; a role that does not exist is refused by name and nothing changes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from leaseq.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def team(database_url: str) -> Iterator[str]:
    name = f"lq_{uuid.uuid4().hex[:8]}_team"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("DELETE FROM leaseq.queue_roles")
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_queue_is_given_to_roles_shown_and_opened_again(
    database_url: str, team: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    assert run(capsys, "queues", "show", *db)[:2] == (0, "every queue is open to every role\n")
    code, out, _ = run(capsys, "queues", "give", "invoices", "--workers", team, *db)
    assert (code, out) == (0, f"invoices workers: {team}\n")
    given = json.loads(run(capsys, "queues", "show", "--json", *db)[1])
    assert given == [{"queue": "invoices", "use": "worker", "role": team}]
    code, _, err = run(capsys, "queues", "give", "invoices", "--producers", "nobody_here", *db)
    assert code != 0 and 'role "nobody_here" does not exist' in err
    assert json.loads(run(capsys, "queues", "show", "--json", *db)[1]) == given
    code, out, _ = run(capsys, "queues", "give", "invoices", "--workers", "all", *db)
    assert (code, out) == (0, "invoices workers: every worker role\n")
    assert run(capsys, "queues", "show", *db)[1] == "every queue is open to every role\n"
