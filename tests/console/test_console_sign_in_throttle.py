"""The sign-in throttle through the real ``leaseq console`` server (uvicorn) behind a proxy.

The console runs with ``--auth basic --trusted-proxy 127.0.0.1``. A request from 127.0.0.1 is
the trusted proxy's (an Ingress controller's): its X-Forwarded-For names the client. A request
from 127.0.0.2, another loopback address this machine may send from, is an untrusted peer's:
whatever it forwards is ignored.
"""

from __future__ import annotations

import base64
import http.client
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.consoledb import ConsoleDb
from support.consoleserver import ConsoleProcess
from support.polling import wait_for

pytestmark = pytest.mark.process

PROXY = "127.0.0.1"
UNTRUSTED = "127.0.0.2"
USERS = {"ann": "correct horse", "bob": "battery staple"}


@pytest.fixture
def console(console_db: ConsoleDb, tmp_path: Path) -> Iterator[ConsoleProcess]:
    with socket.socket() as probe:
        try:
            probe.bind((UNTRUSTED, 0))
        except OSError:
            pytest.skip(f"this machine cannot send from {UNTRUSTED} (Linux routes 127.0.0.0/8)")
    users = tmp_path / "users"
    users.write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    server = ConsoleProcess(
        console_db.admin_url,
        tmp_path / "console.log",
        *("--auth", "basic", "--basic-auth-file", str(users), "--trusted-proxy", PROXY),
    )
    try:
        yield server
    finally:
        server.stop()


def sign_in(
    console: ConsoleProcess, user: str, password: str, *, peer: str, forwarded: str | None
) -> int:
    """GET / as ``user`` from the source address ``peer``, forwarding for ``forwarded``."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", console.port, timeout=10, source_address=(peer, 0)
    )
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    headers = {"Authorization": f"Basic {token}"}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    try:
        conn.request("GET", "/", headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def via_proxy(console: ConsoleProcess, user: str, password: str, client: str) -> int:
    return sign_in(console, user, password, peer=PROXY, forwarded=client)


def test_behind_a_trusted_proxy_one_clients_failures_do_not_block_another(
    console: ConsoleProcess,
) -> None:
    x, y = "203.0.113.5", "198.51.100.7"
    assert [via_proxy(console, "ann", f"guess-{n}", x) for n in range(5)] == [401] * 5
    assert via_proxy(console, "ann", USERS["ann"], x) == 429
    assert via_proxy(console, "ann", USERS["ann"], y) == 200
    assert via_proxy(console, "bob", USERS["bob"], x) == 200


def test_a_forwarded_address_from_an_untrusted_peer_is_ignored(
    console: ConsoleProcess,
) -> None:
    # Each guess claims another client: believed, it would never meet a limit.
    statuses = [
        sign_in(console, "ann", f"guess-{n}", peer=UNTRUSTED, forwarded=f"203.0.113.{n}")
        for n in range(5)
    ]
    assert statuses == [401] * 5
    assert sign_in(console, "ann", USERS["ann"], peer=UNTRUSTED, forwarded="203.0.113.99") == 429
    # The proxy's own client is another, and is named in the log as itself.
    assert via_proxy(console, "ann", "guess", "198.51.100.7") == 401
    wait_for(
        lambda: "console sign-in failed: user 'ann' from 198.51.100.7" in console.log.read_text(),
        "the proxied failure logged with the forwarded client",
        timeout=10,
    )
    log = console.log.read_text()
    assert log.count(f"console sign-in failed: user 'ann' from {UNTRUSTED}") == 5
    assert "203.0.113." not in log


def test_the_user_limit_holds_across_addresses_but_not_where_the_user_signed_in(
    console: ConsoleProcess,
) -> None:
    home = "192.0.2.10"
    assert via_proxy(console, "ann", USERS["ann"], home) == 200
    # 20 guesses, 4 from each of 5 clients: no pair meets its limit of 5.
    statuses = [via_proxy(console, "ann", f"guess-{n}", f"203.0.113.{n // 4}") for n in range(20)]
    assert statuses == [401] * 20
    assert via_proxy(console, "ann", USERS["ann"], "198.51.100.7") == 429  # a new client
    assert via_proxy(console, "ann", USERS["ann"], home) == 200  # where she signed in before
    assert via_proxy(console, "bob", USERS["bob"], "198.51.100.7") == 200
