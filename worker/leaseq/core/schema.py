"""Schema migrations: numbered files in ``leaseq_sql/migrations``, applied under a lock."""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from importlib import resources

from leaseq.core._store.console import ConsoleStore
from leaseq.core._store.store import Store
from leaseq.core.db import Conn, Db, borrow
from leaseq.core.errors import (
    ConfigError,
    DatabaseError,
    SchemaNotReady,
    SchemaTooNew,
    ServerTooOld,
    WrongEncoding,
)

log = logging.getLogger("leaseq.migrate")

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    script: bytes


@dataclass(frozen=True)
class MigrationReport:
    """What a migrate run did: versions applied now, the version the database is at, and
    the GRANT/REVOKE/POLICY statements run for the component roles (if roles were given)."""

    applied: list[int]
    version: int
    grants: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ComponentRoles:
    """The database role each component runs as (docs/guides/security.md); None: no role for it.

    Each must exist already, be an ordinary role (no superuser, no BYPASSRLS), not own
    leaseq's tables, and serve one component only."""

    worker: str | None = None
    operator: str | None = None
    producer: str | None = None

    def __bool__(self) -> bool:
        return any((self.worker, self.operator, self.producer))


@dataclass(frozen=True)
class ConsoleRole:
    """The database role the web console runs as (docs/guides/console.md): read access,
    plus, with ``admin``, only its two audited actions (retry dead jobs, cancel jobs).
    An ordinary role, not a component's, nor the owner."""

    role: str
    admin: bool = True
    #: Let ``role`` take over from another registered console role (whose privileges are
    #: then revoked); without it, :func:`migrate` refuses to switch console roles.
    replace: bool = False


@functools.cache
def known_migrations() -> tuple[Migration, ...]:
    """The migrations shipped with this leaseq, in version order."""
    folder = resources.files("leaseq_sql").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_bytes()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration files are not numbered 1..n without gaps: {versions}")
    return tuple(found)


def code_version() -> int:
    """The schema version this code expects."""
    return known_migrations()[-1].version


def _refuse_newer(applied: dict[int, str]) -> None:
    newest = max(applied, default=0)
    if newest > code_version():
        raise SchemaTooNew(
            f"the database's leaseq schema is at version {newest} ({applied[newest]}), newer "
            f"than this leaseq ({code_version()}); upgrade leaseq instead of migrating. "
            "Nothing was changed."
        )


#: The oldest PostgreSQL leaseq's schema runs on (server_version_num): its views check the
#: reader's own privileges and row policies (security_invoker), which PostgreSQL 15 added.
OLDEST_SERVER = 150000


def server_refusal(version_num: int, version: str, encoding: str) -> DatabaseError | None:
    """Why leaseq cannot use a server of this version and a database of this encoding, or
    None when it can."""
    if version_num < OLDEST_SERVER:
        return ServerTooOld(
            f"this server runs PostgreSQL {version}; leaseq needs PostgreSQL 15 or later (its "
            "views check the reader's own privileges, security_invoker, which 15 added). "
            "Upgrade the server or point leaseq at a newer one. Nothing was changed."
        )
    if encoding != "UTF8":
        return WrongEncoding(
            f"the database's encoding is {encoding}; leaseq needs UTF8 (with {encoding} every "
            "text value, job types included, reads back as bytes, so no handler would ever "
            "match). Create the database with ENCODING 'UTF8' TEMPLATE template0. Nothing was "
            "changed."
        )
    return None


def _require_server(conn: Conn, store: Store) -> None:
    refusal = server_refusal(*store.migration_server(conn))
    if refusal is not None:
        raise refusal


def _refuse_a_second_console_role(conn: Conn, role: str) -> None:
    registered = ConsoleStore().registered_console_role(conn, role=role)
    if registered is None or registered["same"]:
        return
    raise ConfigError(
        f"{registered['role']} is leaseq's console role; one console role is registered at a "
        f"time, and granting {role} would revoke every privilege of {registered['role']}. To "
        f"replace it, run again with --console-replace true (ConsoleRole(..., replace=True)); "
        f"to keep it, pass --console-role {registered['role']}. No grant was changed."
    )


class Schema:
    """leaseq's schema in one database: migrate it, or check it is the one this code needs."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._store = Store()

    def migrate(
        self, roles: ComponentRoles | None = None, console: ConsoleRole | None = None
    ) -> MigrationReport:
        """Apply every missing migration, each in its own transaction, and report what was done;
        then, when ``roles`` names any, grant each component's role exactly its privileges
        (one transaction; everything on leaseq's objects is revoked from the previous and the
        given roles first, so a rerun converges to the same grants). Given no roles, a run
        that applied migrations grants the roles an earlier run registered the same way.

        Idempotent; safe to run from many pods at once (a session advisory lock serialises
        them). ``console``, when given, grants the web console's role its privileges the
        same way (after the components'); naming a role other than the registered console
        role raises :class:`ConfigError`, granting nothing, unless ``console.replace``.
        Refuses, changing nothing, a database migrated by a newer leaseq, one not in UTF8
        (:class:`WrongEncoding`) and a server older than PostgreSQL 15
        (:class:`ServerTooOld`). A given connection
        must be in autocommit mode and not used by anyone else meanwhile.
        """
        with borrow(self._db, "migrate") as conn:
            return self._migrate(conn, roles or ComponentRoles(), console)

    def _migrate(
        self, conn: Conn, roles: ComponentRoles, console: ConsoleRole | None
    ) -> MigrationReport:
        store = self._store
        _require_server(conn, store)
        store.migration_lock(conn)
        try:
            with conn.transaction():
                store.migration_bootstrap(conn)
            applied = store.migration_applied(conn)
            _refuse_newer(applied)
            done = []
            for migration in known_migrations():
                if migration.version in applied:
                    continue
                with conn.transaction():
                    store.migration_apply(conn, migration.script)
                    store.migration_record(conn, version=migration.version, name=migration.name)
                log.info("applied migration %04d_%s", migration.version, migration.name)
                done.append(migration.version)
            if console is not None and not console.replace:
                _refuse_a_second_console_role(conn, console.role)
            grants: list[str] = []
            if roles:
                with conn.transaction():
                    grants = store.grants_apply(
                        conn, worker=roles.worker, operator=roles.operator, producer=roles.producer
                    )
            elif done:
                # New migrations may change what a role needs (a new function of the worker's
                # door): the roles registered by an earlier run get it now, not at the next
                # run that names them.
                with conn.transaction():
                    grants = store.grants_reapply(conn)
            if console is not None:
                with conn.transaction():
                    grants += ConsoleStore().console_grants_apply(
                        conn, role=console.role, admin=console.admin
                    )
            for statement in grants:
                if statement.startswith("skipped"):
                    log.warning("%s", statement)
                else:
                    log.info("granted: %s", statement)
            return MigrationReport(applied=done, version=code_version(), grants=grants)
        finally:
            store.migration_unlock(conn)

    def check(self) -> int:
        """The database's schema version if it is exactly this code's; raises
        :class:`ServerTooOld` (before PostgreSQL 15), :class:`WrongEncoding` (not UTF8),
        :class:`SchemaNotReady` (none, or older) or
        :class:`SchemaTooNew` otherwise."""
        with borrow(self._db, "check schema") as conn:
            _require_server(conn, self._store)
            if not self._store.migration_schema_exists(conn):
                raise SchemaNotReady(
                    "this database has no leaseq schema; "
                    "run `leaseq migrate --database-url URL` first"
                )
            applied = self._store.migration_applied(conn)
        _refuse_newer(applied)
        current = max(applied, default=0)
        if current < code_version():
            raise SchemaNotReady(
                f"the database's leaseq schema is at version {current}, this leaseq needs "
                f"{code_version()}; run `leaseq migrate --database-url URL`"
            )
        return current


def migrate(
    conn: Conn, roles: ComponentRoles | None = None, console: ConsoleRole | None = None
) -> MigrationReport:
    """:meth:`Schema.migrate` on ``conn`` (autocommit, not shared meanwhile)."""
    return Schema(conn).migrate(roles, console)


def check_schema(conn: Conn) -> int:
    """:meth:`Schema.check` on ``conn``."""
    return Schema(conn).check()
