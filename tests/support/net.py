"""Loopback HTTP for tests: a port to serve on, and a GET that reports any status."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (for a server the test starts next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET ``url``: (status, body), error statuses included; OSError only when nothing
    answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
