"""The present tense of leaseq's SQL against the replay of its migrations.

``sql/leaseq_sql/definitions/*.sql`` holds the current definition of every function, trigger,
policy decision (row level security) and grant; the migrations are the upgrade path written
from them. :func:`definitions` describes what the catalogs hold of those kinds, one entry per
object; :func:`blank` removes every such definition from a migrated database (function bodies
replaced by stubs, triggers and policies dropped, row level security off, privileges back to
PostgreSQL's defaults) so that applying the definitions must restore all of it, and
:func:`disagreements` says which objects differ between two descriptions.

Used by tests/integration/test_definitions.py and scripts/next_migration.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import psycopg
from psycopg import sql

DEFINITIONS = Path(__file__).resolve().parents[2] / "sql" / "leaseq_sql" / "definitions"

# Privileges as (grantee=privilege) lists, PUBLIC for grantee 0 and `owner` for the owner
# (whoever ran the migrations), the defaults spelled out: a NULL ACL and its explicit
# equivalent read the same.
_ACL = """
(SELECT coalesce(string_agg(e, ',' ORDER BY e), '')
   FROM (SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' WHEN a.grantee = {owner} THEN 'owner'
                     ELSE pg_get_userbyid(a.grantee) END
                || '=' || a.privilege_type || CASE WHEN a.is_grantable THEN '*' ELSE '' END AS e
           FROM aclexplode(coalesce({acl}, acldefault({kind}, {owner}))) a) x)
"""

_FUNCTION_ACL = _ACL.format(acl="p.proacl", kind="'f'", owner="p.proowner")
_RELATION_ACL = _ACL.format(
    acl="c.relacl",
    kind="(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::\"char\"",
    owner="c.relowner",
)
_COLUMN_ACL = _ACL.format(acl="a.attacl", kind="'c'", owner="c.relowner")
_SCHEMA_ACL = _ACL.format(acl="n.nspacl", kind="'n'", owner="n.nspowner")

DESCRIBE = f"""
SELECT 'function ' || p.oid::regprocedure::text,
       pg_get_functiondef(p.oid) || E'\\nprivileges ' ||
       {_FUNCTION_ACL}
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'leaseq'
UNION ALL
SELECT 'trigger ' || t.tgname || ' on ' || t.tgrelid::regclass::text,
       pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE NOT t.tgisinternal
UNION ALL
SELECT 'policy ' || p.policyname || ' on leaseq.' || p.tablename,
       p.permissive || ' ' || p.cmd || ' to ' || array_to_string(p.roles, ',')
       || ' using ' || coalesce(p.qual, '-') || ' check ' || coalesce(p.with_check, '-')
  FROM pg_policies p WHERE p.schemaname = 'leaseq'
UNION ALL
SELECT 'row level security ' || c.oid::regclass::text,
       c.relrowsecurity::text || ' forced ' || c.relforcerowsecurity::text
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE c.relkind IN ('r', 'p') AND (c.relrowsecurity OR c.relforcerowsecurity)
UNION ALL
SELECT 'privileges on ' || c.oid::regclass::text,
       {_RELATION_ACL}
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S')
UNION ALL
SELECT 'privileges on ' || c.oid::regclass::text || '.' || quote_ident(a.attname),
       {_COLUMN_ACL}
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE a.attacl IS NOT NULL AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'privileges on schema leaseq',
       {_SCHEMA_ACL}
  FROM pg_namespace n WHERE n.nspname = 'leaseq'
"""

# Each function as a stub of the same signature: no body, no SECURITY DEFINER, no settings.
_FUNCTIONS = """
SELECT p.oid::regprocedure::text, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
       p.proowner
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'leaseq'
 WHERE p.prokind = 'f'
"""

_TRIGGERS = """
SELECT t.tgname, t.tgrelid::regclass::text
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE NOT t.tgisinternal
"""

_GRANTEES = """
SELECT DISTINCT pg_get_userbyid(a.grantee)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq',
       aclexplode(c.relacl) a
 WHERE a.grantee <> 0 AND a.grantee <> c.relowner
UNION
SELECT pg_get_userbyid(a.grantee)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'leaseq',
       aclexplode(p.proacl) a
 WHERE a.grantee <> 0 AND a.grantee <> p.proowner
UNION
SELECT pg_get_userbyid(a.grantee)
  FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq',
       aclexplode(t.attacl) a
 WHERE a.grantee <> 0 AND a.grantee <> c.relowner
UNION
SELECT pg_get_userbyid(a.grantee)
  FROM pg_namespace n, aclexplode(n.nspacl) a
 WHERE n.nspname = 'leaseq' AND a.grantee <> 0 AND a.grantee <> n.nspowner
"""

_RLS_TABLES = """
SELECT c.oid::regclass::text
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq'
 WHERE c.relkind IN ('r', 'p') AND (c.relrowsecurity OR c.relforcerowsecurity)
"""

_COLUMN_GRANTS = """
SELECT c.oid::regclass::text, quote_ident(t.attname),
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
  FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq',
       aclexplode(t.attacl) a
 WHERE a.grantee <> c.relowner
"""

_POLICIES = "SELECT policyname, tablename FROM pg_policies WHERE schemaname = 'leaseq'"


def files(folder: Path = DEFINITIONS) -> dict[str, str]:
    """The present tense: each definitions file's name and text, in the order they apply."""
    return {p.name: p.read_text() for p in sorted(folder.glob("*.sql"))}


def describe(url: str) -> dict[str, str]:
    """Every function, trigger, policy, row level security flag and privilege in schema
    leaseq, by object."""
    with psycopg.connect(url) as conn:
        return {str(k): str(v) for k, v in conn.execute(DESCRIBE)}


def apply(url: str, present: Mapping[str, str]) -> None:
    """Run the given definitions files, in order, in one transaction."""
    with psycopg.connect(url) as conn:
        for text in present.values():
            conn.execute(text.encode())


def blank(url: str) -> None:
    """Remove every definition :func:`describe` reports, leaving tables, types and data: each
    function becomes a stub that raises, every trigger and policy is dropped, row level
    security is off, and every privilege is back to PostgreSQL's default for a new object
    (EXECUTE on functions for PUBLIC, nothing else for anyone but the owner)."""
    with psycopg.connect(url) as conn:
        for signature, arguments, result, _ in conn.execute(_FUNCTIONS).fetchall():
            name = str(signature).split("(", 1)[0]
            conn.execute(
                f"CREATE OR REPLACE FUNCTION {name}({arguments}) RETURNS {result}"
                " LANGUAGE plpgsql AS $stub$BEGIN RAISE EXCEPTION 'blank'; END$stub$".encode()
            )
        for trigger, table in conn.execute(_TRIGGERS).fetchall():
            conn.execute(
                sql.SQL("DROP TRIGGER {} ON {}").format(
                    sql.Identifier(str(trigger)), sql.SQL(str(table))
                )
            )
        for policy, table in conn.execute(_POLICIES).fetchall():
            conn.execute(
                sql.SQL("DROP POLICY {} ON leaseq.{}").format(
                    sql.Identifier(str(policy)), sql.Identifier(str(table))
                )
            )
        for (table,) in conn.execute(_RLS_TABLES).fetchall():
            conn.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY".encode())
            conn.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY".encode())
        grantees = [sql.Identifier(str(g)) for (g,) in conn.execute(_GRANTEES).fetchall()]
        everyone = sql.SQL(", ").join([sql.SQL("PUBLIC"), *grantees])
        for what in (
            "ALL TABLES IN SCHEMA",
            "ALL SEQUENCES IN SCHEMA",
            "ALL FUNCTIONS IN SCHEMA",
            "SCHEMA",
        ):
            conn.execute(sql.SQL("REVOKE ALL ON {} leaseq FROM {}").format(sql.SQL(what), everyone))
        conn.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA leaseq TO PUBLIC")
        # Column privileges are not reached by REVOKE ... ON ALL TABLES.
        for table, column, grantee in conn.execute(_COLUMN_GRANTS).fetchall():
            conn.execute(f"REVOKE ALL ({column}) ON {table} FROM {grantee}".encode())


def disagreements(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The objects whose description differs, is missing or is new, each with both sides."""
    out = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            out.append(f"{key}\n  migrations: {before.get(key)}\n  present:    {after.get(key)}")
    return out


def names(entries: Iterable[str]) -> list[str]:
    """The object names of :func:`disagreements`' entries."""
    return [e.split("\n", 1)[0] for e in entries]
