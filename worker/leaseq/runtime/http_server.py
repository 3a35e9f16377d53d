"""One HTTP port for the worker: /metrics, /healthz (loops alive), /readyz (may take work)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from leaseq.core.errors import ConfigError

log = logging.getLogger("leaseq.http")

Probe = Callable[[], tuple[bool, str]]


class ProbeServer:
    """Serves ``registry`` at /metrics and the two probes, each returning 200 or 503 with a
    one-line reason, from a daemon thread."""

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        healthy: Probe,
        ready: Probe,
        *,
        address: str = "0.0.0.0",  # noqa: S104 - a pod's port unless told otherwise
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: _probe(healthy),
            "/readyz": lambda: _probe(ready),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, ctype, body = route() if route else (404, "text/plain", b"not found\n")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: " + format, *args)

        server_class = _IPv6Server if ":" in address else ThreadingHTTPServer
        try:
            self._server = server_class((address, port), Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve HTTP on {address} port {port} ({exc}); "
                "set --metrics-port or --metrics-address"
            ) from exc
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="leaseq-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info(
            "serving /metrics, /healthz and /readyz on %s port %d",
            self._server.server_address[0],
            self.port,
        )

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _probe(check: Probe) -> tuple[int, str, bytes]:
    ok, reason = check()
    return (200 if ok else 503), "text/plain; charset=utf-8", (reason + "\n").encode()
