"""The store's methods for sql/queries/tenants.sql: one typed method per statement."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.rows import DictRow

from leaseq.core._store.runner import Conn, Runner


class TenantStore(Runner):
    """The statements of which roles may use a queue (tenants.sql), and only those."""

    def queue_roles_set(
        self, conn: Conn, *, queue: str, component: str, roles: Sequence[str]
    ) -> list[str]:
        params = {"queue": queue, "component": component, "roles": list(roles)}
        rows = self._dicts(conn, "queue_roles_set", params, "give queue")
        return [str(r["role_name"]) for r in rows]

    def queue_roles_list(self, conn: Conn) -> list[DictRow]:
        return self._dicts(conn, "queue_roles_list", None, "show queue roles")
