"""The present tense of the SQL (sql/leaseq_sql/definitions/) and the migrations agree.

Every migration is replayed into one database, with a role for each component and the
console granted as `leaseq migrate --worker-role ... --console-role ...` grants them. Its
functions (whole, as pg_get_functiondef prints them, with their privileges), triggers (as
pg_get_triggerdef prints them, clause included), policies, row level security and privileges
are described. Then every one of those definitions is removed (tests/support/catalog.py's
blank), the definitions files are applied and the grants run again, as each migrate runs
them: the description must be the same. So the files define everything the migrations leave,
and nothing else; a body, a clause, a policy or a grant that differs is named. The cases
below break the files on purpose and show each kind of difference caught.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

import leaseq
from support import catalog
from support.roles import Roles, login_roles, migrate_granting_all


@pytest.fixture
def roles(empty_database_url: str) -> Iterator[Roles]:
    with login_roles(empty_database_url, "console") as made:
        yield made


def present_against_migrations(url: str, roles: Roles, present: dict[str, str]) -> list[str]:
    migrate_granting_all(url, roles)
    replayed = catalog.describe(url)
    catalog.blank(url)
    catalog.apply(url, present)
    migrate_granting_all(url, roles)
    return catalog.disagreements(replayed, catalog.describe(url))


def test_the_migrations_define_exactly_the_present_tense(
    empty_database_url: str, roles: Roles
) -> None:
    differences = present_against_migrations(empty_database_url, roles, catalog.files())
    assert not differences, "\n".join(differences)


def test_blank_removes_every_definition(empty_database_url: str, roles: Roles) -> None:
    """The comparison is only as strong as the blanking: nothing it describes survives it."""
    migrate_granting_all(empty_database_url, roles)
    replayed = catalog.describe(empty_database_url)
    catalog.blank(empty_database_url)
    blanked = catalog.describe(empty_database_url)
    functions = [k for k in replayed if k.startswith("function ")]
    assert functions and not [k for k in functions if blanked[k] == replayed[k]]
    assert not [k for k in blanked if k.startswith(("trigger ", "policy ", "row level security"))]


# (what is broken, the file, the text replaced, its replacement, the object named)
BREAKS = [
    (
        "a function's body",
        "flow.sql",
        "PERFORM pg_notify('leaseq_jobs', OLD.queue);",
        "NULL;",
        "function leaseq.jobs_on_status()",
    ),
    (
        "a trigger's clause",
        "flow.sql",
        "FOR EACH ROW WHEN (NEW.key IS NOT NULL) EXECUTE FUNCTION leaseq.flow_on_enqueue()",
        "FOR EACH ROW WHEN (NEW.key <> '') EXECUTE FUNCTION leaseq.flow_on_enqueue()",
        "trigger jobs_flow_enqueue on leaseq.jobs",
    ),
    (
        "a policy",
        "grants.sql",
        "leaseq_worker_own ON leaseq.workers FOR ALL TO %s USING (registered_by = current_user)",
        "leaseq_worker_own ON leaseq.workers FOR ALL TO %s USING (true)",
        "policy leaseq_worker_own on leaseq.workers",
    ),
    (
        "a column grant",
        "grants.sql",
        "last_error, last_error_code, max_attempts) ON leaseq.jobs",
        "last_error, last_error_code) ON leaseq.jobs",
        "privileges on leaseq.jobs.max_attempts",
    ),
    (
        "a function's PUBLIC EXECUTE",
        "pipelines.sql",
        "REVOKE ALL ON FUNCTION leaseq.pipeline_changed(leaseq.jobs, leaseq.jobs) FROM PUBLIC;",
        "",
        "function leaseq.pipeline_changed(leaseq.jobs,leaseq.jobs)",
    ),
    (
        "a SECURITY DEFINER",
        "history.sql",
        "RETURNS SETOF text\nLANGUAGE plpgsql\nSECURITY DEFINER\n",
        "RETURNS SETOF text\nLANGUAGE plpgsql\n",
        "function leaseq.history_ensure_partitions(integer,timestamp with time zone)",
    ),
    (
        "row level security",
        "grants.sql",
        "ALTER TABLE leaseq.job_results ENABLE ROW LEVEL SECURITY;",
        "",
        "row level security leaseq.job_results",
    ),
    (
        "a missing definition",
        "jobs.sql",
        "CREATE OR REPLACE FUNCTION leaseq.retry_delay(",
        "CREATE OR REPLACE FUNCTION leaseq.retry_delay_gone(",
        "function leaseq.retry_delay(integer,double precision,double precision)",
    ),
]


@pytest.mark.parametrize(
    ("what", "name", "old", "new", "named"), BREAKS, ids=[b[0] for b in BREAKS]
)
def test_a_difference_is_named(
    empty_database_url: str, roles: Roles, what: str, name: str, old: str, new: str, named: str
) -> None:
    present = catalog.files()
    assert present[name].count(old) == 1, f"the text to break ({what}) is not in {name} once"
    present[name] = present[name].replace(old, new)
    differences = present_against_migrations(empty_database_url, roles, present)
    assert named in catalog.names(differences), "\n".join(differences)


def load_next_migration() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "next_migration.py"
    spec = importlib.util.spec_from_file_location("next_migration", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_next_migration_is_written_from_the_definitions(
    server_url: str, empty_database_url: str
) -> None:
    """scripts/next_migration.py: edit the definitions (a body, a trigger's clause, a PUBLIC
    EXECUTE, a function removed), and the statements it writes bring the replay of the
    migrations exactly to the edited definitions."""
    script = load_next_migration()
    present = catalog.files()
    edits = [
        ("flow.sql", "PERFORM pg_notify('leaseq_jobs', OLD.queue);", "NULL;"),
        ("flow.sql", "WHEN (NEW.key IS NOT NULL) EXECUTE", "WHEN (NEW.key <> '') EXECUTE"),
        (
            "jobs.sql",
            "\nLANGUAGE sql VOLATILE\n",
            "\nLANGUAGE sql VOLATILE\nSET work_mem = '1MB'\n",
        ),
        (
            "pipelines.sql",
            "REVOKE ALL ON FUNCTION leaseq.pipeline_changed(leaseq.jobs, leaseq.jobs) FROM PUBLIC;",
            "",
        ),
    ]
    for name, old, new in edits:
        assert present[name].count(old) == 1, (name, old)
        present[name] = present[name].replace(old, new)
    text = present["flow.sql"]
    start = text.index("-- Skips a blocked aggregate's dead head")
    end = text.index("$$ SELECT leaseq.flow_promote(q, ok) $$;") + len(
        "$$ SELECT leaseq.flow_promote(q, ok) $$;"
    )
    present["flow.sql"] = text[:start] + text[end:].replace(" leaseq.flow_unblock(text, text),", "")

    written = script.statements(server_url, present)
    assert "DROP FUNCTION leaseq.flow_unblock(text,text);" in written
    with leaseq.connect(empty_database_url, action="migrate") as conn:
        leaseq.migrate(conn)
    with psycopg.connect(empty_database_url) as conn:
        conn.execute("\n".join(written).encode())
    migrated = catalog.describe(empty_database_url)
    catalog.blank(empty_database_url)
    catalog.apply(empty_database_url, present)
    differences = catalog.disagreements(migrated, catalog.describe(empty_database_url))
    assert not differences, "\n".join(differences)


def test_no_definer_function_is_public_or_unpinned(database_url: str) -> None:
    """A SECURITY DEFINER function runs as the owner: PUBLIC must not execute it (a trigger
    function included: EXECUTE is checked only by CREATE TRIGGER, and any role may create one
    on a temporary table of its own), and its search_path is pinned to pg_catalog, pg_temp."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            """SELECT p.oid::regprocedure::text,
                      has_function_privilege('public', p.oid, 'EXECUTE'),
                      coalesce(array_to_string(p.proconfig, ';'), '')
                 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = 'leaseq' AND p.prosecdef"""
        ).fetchall()
    assert rows
    public = [name for name, executable, _ in rows if executable]
    unpinned = [name for name, _, config in rows if config != "search_path=pg_catalog, pg_temp"]
    assert not public and not unpinned, (public, unpinned)
