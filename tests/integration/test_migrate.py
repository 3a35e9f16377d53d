"""`leaseq migrate`: idempotent, serialised by an advisory lock, refuses a newer schema, and
the migrations replay to exactly the checked-in schema."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

import leaseq
from leaseq.core.schema import code_version, known_migrations
from support import catalog
from support.roles import Roles, login_roles, migrate_granting_all
from support.upgrade import migrate_before

EXPECTED_SCHEMA = Path(__file__).with_name("expected_schema.txt")

# A description of the leaseq schema from the catalogs, stable across PostgreSQL versions.
SCHEMA_QUERY = """
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'v')
UNION ALL
SELECT 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid)
  FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE k.contype <> 'n'
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
UNION ALL
SELECT 'options ' || c.relname || ' ' || array_to_string(c.reloptions, ',')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE c.reloptions IS NOT NULL
UNION ALL
SELECT 'row level security ' || c.relname
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE c.relrowsecurity
UNION ALL
SELECT 'type ' || t.typname || ' ' || string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
  FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
  JOIN pg_namespace n ON n.oid = t.typnamespace AND n.nspname = 'leaseq'
 GROUP BY t.typname
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_get_function_arguments(p.oid) || ') '
       || pg_get_function_result(p.oid)
       || CASE WHEN p.prosecdef THEN ' security definer' ELSE '' END
       || coalesce(' set ' || array_to_string(p.proconfig, ', '), '')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'leaseq'
ORDER BY 1
"""


def describe(url: str) -> str:
    with psycopg.connect(url) as conn:
        return "\n".join(str(r[0]) for r in conn.execute(SCHEMA_QUERY)) + "\n"


def describe_granted(url: str, roles: Roles) -> str:
    """:func:`describe`, and every trigger, policy, row level security flag and privilege
    (tests/support/catalog.py), each role's name replaced by its component's."""
    lines = describe(url).splitlines()
    for key, text in catalog.describe(url).items():
        if key.startswith("function "):
            lines.append(f"{key} privileges {text.rsplit(chr(10) + 'privileges ', 1)[1]}")
        else:
            lines.append(f"{key}: {text}")
    out = "\n".join(sorted(lines)) + "\n"
    for component, name in roles.names.items():
        out = out.replace(name, f"<{component}>")
    # MAINTAIN exists from PostgreSQL 17 on (test_roles checks who holds it where).
    return re.sub(r",?(<operator>|owner)=MAINTAIN", "", out)


def test_migrations_replay_to_the_checked_in_schema(empty_database_url: str) -> None:
    with login_roles(empty_database_url, "console") as roles:
        migrate_granting_all(empty_database_url, roles)
        actual = describe_granted(empty_database_url, roles)
    if os.environ.get("LEASEQ_UPDATE_SCHEMA"):
        EXPECTED_SCHEMA.write_text(actual)
    assert actual == EXPECTED_SCHEMA.read_text(), (
        "schema differs from tests/integration/expected_schema.txt; if the change is intended,"
        " rerun with LEASEQ_UPDATE_SCHEMA=1 and review the diff"
    )


def test_migrate_is_idempotent_and_concurrent_runs_are_safe(empty_database_url: str) -> None:
    reports: list[leaseq.MigrationReport] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with leaseq.connect(empty_database_url, action="migrate") as conn:
                reports.append(leaseq.migrate(conn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    newest = code_version()
    assert sorted(len(r.applied) for r in reports) == [0, 0, 0, newest]
    with leaseq.connect(empty_database_url, action="test") as conn:
        assert leaseq.migrate(conn).applied == []
        assert leaseq.check_schema(conn) == newest


def test_a_newer_schema_is_refused_without_change(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        conn.execute("INSERT INTO leaseq.schema_migrations (version, name) VALUES (99, 'future')")
        before = describe(database_url)
        with pytest.raises(leaseq.SchemaTooNew, match=r"version 99 .*upgrade leaseq"):
            leaseq.migrate(conn)
        with pytest.raises(leaseq.SchemaTooNew):
            leaseq.check_schema(conn)
        assert describe(database_url) == before


def leaseq_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseq.cli", *args], env=env, capture_output=True, text=True
    )


def test_migrate_command_line(empty_database_url: str) -> None:
    env = {**os.environ, "LEASEQ_DATABASE_URL": empty_database_url}
    assert f"version {code_version()} (0001, " in leaseq_cli("migrate", env=env).stdout
    assert "nothing to apply" in leaseq_cli("migrate", env=env).stdout
    del env["LEASEQ_DATABASE_URL"]
    missing = leaseq_cli("migrate", env=env)
    assert missing.returncode == 2
    assert "--database-url is required" in missing.stderr


def test_an_upgrade_lets_the_registered_console_role_read_steps(empty_database_url: str) -> None:
    """Migration console_steps grants the console role already registered what the job
    page's steps need, without a second `leaseq migrate --console-role`."""
    [steps] = [m for m in known_migrations() if m.name == "console_steps"]
    with login_roles(empty_database_url, "console") as roles:
        console = roles.names["console"]
        with leaseq.connect(empty_database_url, action="test") as conn:
            migrate_before(conn, steps.version)
            conn.execute("SELECT leaseq.apply_console_grants(%s::regrole, true)", (console,))
            assert leaseq.migrate(conn).applied == list(range(steps.version, code_version() + 1))
            job = leaseq.Queue(conn).enqueue("q", "t").job_id
            conn.execute("INSERT INTO leaseq.job_steps (job_id, name) VALUES (%s, 's')", (job,))
        with psycopg.connect(roles.urls["console"]) as conn:
            found = conn.execute("SELECT job_id, name FROM leaseq.job_steps").fetchall()
            assert found == [(job, "s")]
            assert conn.execute("SELECT count(*) FROM leaseq.job_stream").fetchone() == (0,)
