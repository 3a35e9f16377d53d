"""Test helpers for per-component database roles: create login roles, grant, connect as them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

COMPONENTS = ("worker", "operator", "producer")


@dataclass(frozen=True)
class Roles:
    """Login roles made for one test, by component, and URLs that connect as each."""

    names: dict[str, str]
    urls: dict[str, str]


@contextmanager
def login_roles(database_url: str, *extra: str) -> Iterator[Roles]:
    """Make a LOGIN role per component (and per ``extra`` name) with no privileges; afterwards
    drop what they own and hold in this database, then the roles (roles are cluster-wide)."""
    tag = uuid.uuid4().hex[:8]
    names = {c: f"lq_{tag}_{c}" for c in (*COMPONENTS, *extra)}
    with psycopg.connect(database_url, autocommit=True) as admin:
        for name in names.values():
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        yield Roles(names, {c: make_conninfo(database_url, user=n) for c, n in names.items()})
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            idents = [sql.Identifier(n) for n in names.values()]
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.SQL(", ").join(idents)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.SQL(", ").join(idents)))


def migrate_granting_all(url: str, roles: Roles) -> None:
    """What `leaseq migrate` with every role given does (a role per component and, named
    "console", an admin console role): the migrations, then the grants."""
    import leaseq

    names = roles.names
    with leaseq.connect(url, action="migrate") as conn:
        leaseq.migrate(
            conn,
            leaseq.ComponentRoles(names["worker"], names["operator"], names["producer"]),
            leaseq.ConsoleRole(names["console"], admin=True),
        )


@contextmanager
def component_roles(database_url: str) -> Iterator[Roles]:
    """A LOGIN role per component, granted what `leaseq migrate --worker-role ...
    --operator-role ... --producer-role ...` grants each, in ``database_url``."""
    import leaseq

    with login_roles(database_url) as made:
        names = made.names
        with leaseq.connect(database_url, action="migrate") as conn:
            leaseq.migrate(
                conn, leaseq.ComponentRoles(names["worker"], names["operator"], names["producer"])
            )
        yield made
