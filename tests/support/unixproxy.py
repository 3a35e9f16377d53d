"""A loopback TCP port that forwards to a Unix socket, so a container on the host network can
reach the test PostgreSQL when that one listens only on a socket (the embedded server)."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class UnixProxy:
    """Forwards every connection to 127.0.0.1:``port`` to the Unix socket ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="unix-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            upstream = socket.socket(socket.AF_UNIX)
            try:
                upstream.connect(self.path)
            except OSError:
                client.close()
                continue
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()
        for s in self._open:
            s.close()

    def __enter__(self) -> UnixProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
