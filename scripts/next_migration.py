#!/usr/bin/env python3
"""Write the next migration from the present tense of the SQL.

Edit a function, trigger, row level security flag or a function's PUBLIC EXECUTE in
sql/leaseq_sql/definitions/, then run

    python scripts/next_migration.py short_name

It replays every migration into a scratch database (on LEASEQ_TEST_DATABASE_URL's server if
set, else an embedded PostgreSQL), applies the definitions on top, and writes
sql/leaseq_sql/migrations/NNNN_short_name.sql with a statement for each object they change,
add or no longer define. Tables, indexes, types and data moves are not its business: write
them in a file given with --tables (run on the replay first, and put at the top), and say in
the migration's header what changed and why.
tests/integration/test_definitions.py then proves the migrations and the definitions agree.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import leaseq  # noqa: E402
from leaseq.core.schema import code_version  # noqa: E402
from support import catalog  # noqa: E402

MIGRATIONS = REPO / "sql" / "leaseq_sql" / "migrations"


@contextmanager
def server() -> Iterator[str]:
    url = os.environ.get("LEASEQ_TEST_DATABASE_URL")
    if url:
        yield url
        return
    from leaseq.demo.embedded import EmbeddedPostgres

    embedded = EmbeddedPostgres()
    try:
        yield embedded.url
    finally:
        embedded.stop()


@contextmanager
def replayed(server_url: str) -> Iterator[str]:
    """A scratch database with every migration applied; dropped afterwards."""
    name = f"leaseq_next_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE \"{name}\" ENCODING 'UTF8' TEMPLATE template0".encode())
    url = make_conninfo(server_url, dbname=name)
    try:
        with leaseq.connect(url, action="migrate") as conn:
            leaseq.migrate(conn)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def signature(key: str) -> str:
    return key.split(" ", 1)[1]


def statements(server_url: str, present: dict[str, str], tables: str = "") -> list[str]:
    """What brings the replay of the migrations to the ``present`` definitions files, object
    by object: ``tables`` (hand-written table changes the definitions need) is run on the
    replay, which is described; then every definition in it is removed and the files applied
    (as tests/integration/test_definitions.py does), and each difference written."""
    with replayed(server_url) as url:
        if tables:
            with psycopg.connect(url) as conn:
                conn.execute(tables.encode())
        before = catalog.describe(url)
        catalog.blank(url)
        catalog.apply(url, present)
        after = catalog.describe(url)
    out = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if new is None or "RAISE EXCEPTION 'blank'" in new:
            out.append(_drop(key))
        else:
            out.append(_statement(key, old, new))
    return [s for s in out if s]


def _drop(key: str) -> str:
    kind = key.split(" ", 1)[0]
    if kind == "function":
        return f"DROP FUNCTION {signature(key)};"
    if kind == "trigger":
        name, table = signature(key).split(" on ")
        return f"DROP TRIGGER {name} ON {table};"
    if kind == "row":
        table = key.removeprefix("row level security ")
        return f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY;"
    return f"-- by hand: {key} is gone"


def _statement(key: str, old: str | None, new: str) -> str:
    kind = key.split(" ", 1)[0]
    if kind == "function":
        fn = signature(key)
        text, privileges = new.rsplit("\nprivileges ", 1)
        parts = (
            [] if old is not None and old.rsplit("\nprivileges ", 1)[0] == text else [text + ";"]
        )
        was_public = old is None or "PUBLIC=EXECUTE" in old.rsplit("\nprivileges ", 1)[1]
        if was_public and "PUBLIC=EXECUTE" not in privileges:
            parts.append(f"REVOKE ALL ON FUNCTION {fn} FROM PUBLIC;")
        elif not was_public and "PUBLIC=EXECUTE" in privileges:
            parts.append(f"GRANT EXECUTE ON FUNCTION {fn} TO PUBLIC;")
        return "\n".join(parts)
    if kind == "trigger":
        definition = new.rsplit(" enabled ", 1)[0]
        return definition.replace("CREATE TRIGGER", "CREATE OR REPLACE TRIGGER", 1) + ";"
    if kind == "row":
        table = key.removeprefix("row level security ")
        return f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;"
    return f"-- by hand: {key}\n--   was {old}\n--   now {new}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the migration's short name, e.g. flow_release_order")
    parser.add_argument(
        "--tables",
        type=Path,
        help="a file of hand-written table changes (columns, indexes, data moves) the "
        "definitions need: run before them, and written at the top of the migration",
    )
    args = parser.parse_args()
    if not args.name.isidentifier():
        parser.error(f"the name must be letters, digits and underscores: {args.name!r}")
    with server() as url:
        tables = args.tables.read_text() if args.tables else ""
        found = statements(url, catalog.files(), tables)
    if not found:
        print("the definitions and the migrations agree: no migration to write")
        return 0
    path = MIGRATIONS / f"{code_version() + 1:04d}_{args.name}.sql"
    header = (
        "-- leaseq schema: WHAT CHANGED AND WHY (written from sql/leaseq_sql/definitions/ by\n"
        "-- scripts/next_migration.py; add tables, indexes and data moves by hand).\n\n"
    )
    path.write_text(
        header + (tables.strip() + "\n\n" if tables else "") + "\n\n".join(found) + "\n"
    )
    print(f"wrote {path.relative_to(REPO)}: {len(found)} statement(s); edit its header")
    return 0


if __name__ == "__main__":
    sys.exit(main())
