"""A TCP proxy that a test can cut: every connection through it drops, and new ones are
refused, until it is restored. Lets one worker lose PostgreSQL while the rest keep it."""

from __future__ import annotations

import contextlib
import socket
import threading

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to the server of ``database_url`` (TCP or Unix socket)."""

    def __init__(self, database_url: str) -> None:
        params = conninfo_to_dict(database_url)
        host = str(params.get("host") or "127.0.0.1")
        port = int(params.get("port") or 5432)
        self.target: tuple[str, int] | str = (
            f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
        )
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.url = make_conninfo(database_url, host="127.0.0.1", port=str(self.port))
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        # Server sockets of the connections open now, and those whose next reply is dropped.
        self._upstreams: list[socket.socket] = []
        self._drop: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Drop every connection now and refuse new ones (they are closed at once)."""
        with self._lock:
            self._cut = True
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
            self._open.clear()

    def drop_next_reply(self) -> None:
        """On every connection open now, the server's next reply is thrown away and the
        connection closed: the statement it answered ran (and, in autocommit, committed), but
        the client never hears so. New connections are not affected."""
        with self._lock:
            self._drop = set(self._upstreams)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    client.close()
                    continue
            try:
                upstream = self._connect()
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
                self._upstreams.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _connect(self) -> socket.socket:
        if isinstance(self.target, str):
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            return upstream
        return socket.create_connection(self.target)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    dropped = src in self._drop
                if dropped:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # shutdown, not only close: the other direction's thread is blocked in recv on
            # these sockets, and a close alone would neither wake it nor tell the peer.
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
