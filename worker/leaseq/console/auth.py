"""Who may open the console: nobody but this machine, basic auth, or a trusted proxy.

Each mode answers one question per request: the name of the person (the *actor*, written into
``leaseq.console_audit`` with every action), or a refusal. Passwords are compared in constant
time and never logged or shown; a failed basic sign-in is logged with its user name and
address, and an address that fails too often is refused for a while
(:mod:`leaseq.console.throttle`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from leaseq.console.throttle import FailedLogins
from leaseq.core.errors import ConfigError

log = logging.getLogger("leaseq.console")

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost`` (an address a browser on this machine uses)."""
    if not host:
        return False
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(host: str) -> str:
    """The name part of a Host header: ``127.0.0.1:8089`` -> 127.0.0.1, ``[::1]:80`` -> ::1."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: the status, a short message for the page, and headers."""

    status: int
    message: str
    headers: Mapping[str, str] | None = None


class Auth:
    """An authentication mode: :meth:`identify` returns the actor's name or a Refusal."""

    name = "auth"

    def identify(
        self, client: str | None, headers: Mapping[str, str]
    ) -> str | Refusal:  # pragma: no cover - interface
        raise NotImplementedError


class LocalOnly(Auth):
    """No authentication: only for a console bound to loopback, and every request must come
    from this machine (a mounted console behind some other listener refuses the rest)."""

    name = "none"

    def identify(self, client: str | None, headers: Mapping[str, str]) -> str | Refusal:
        if not is_loopback(client):
            return Refusal(403, "this console has no authentication and answers only this machine")
        # A page of another site whose name was re-pointed at 127.0.0.1 (DNS rebinding) would
        # be "this machine" too, and same-origin with the console: its Host header gives it
        # away.
        if not is_loopback(_hostname(headers.get("host", ""))):
            return Refusal(403, "this console answers only to a loopback address (127.0.0.1)")
        return "local"


class BasicAuth(Auth):
    """HTTP basic authentication against fixed users (from a Secret: a file or variables)."""

    name = "basic"

    def __init__(
        self,
        users: Mapping[str, str],
        realm: str = "leaseq console",
        failures: FailedLogins | None = None,
    ) -> None:
        if not users or any(not u or not p for u, p in users.items()):
            raise ConfigError("basic auth needs at least one user, each with a non-empty password")
        self._users = dict(users)
        self._realm = realm
        self._failures = FailedLogins() if failures is None else failures

    @classmethod
    def from_file(cls, path: str | Path) -> BasicAuth:
        """Users from ``user:password`` lines (a mounted Kubernetes Secret; # comments)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the basic auth file {path}: {exc.strerror}") from None
        users = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, password = line.partition(":")
            if not sep:
                # Never quote the line: it may be a password.
                raise ConfigError(f"{path}: line {number} is not user:password")
            users[user] = password
        return cls(users)

    def identify(self, client: str | None, headers: Mapping[str, str]) -> str | Refusal:
        challenge = {"WWW-Authenticate": f'Basic realm="{self._realm}", charset="UTF-8"'}
        header = headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return Refusal(401, "sign in to use the console", challenge)
        address = client or "unknown"
        wait = self._failures.blocked_for(address)
        if wait > 0:
            retry = str(math.ceil(wait))
            return Refusal(
                429,
                f"too many failed sign-ins from this address: try again in {retry} s",
                {"Retry-After": retry},
            )
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            self._failed(address, None)
            return Refusal(401, "malformed credentials", challenge)
        expected = self._users.get(user, "")
        # Compare even for unknown users, so timing does not tell which users exist.
        good = hmac.compare_digest(password.encode(), expected.encode() or b"\0" * 16)
        if not (sep and user in self._users and good):
            self._failed(address, user)
            return Refusal(401, "wrong user or password", challenge)
        self._failures.succeeded(address)
        return user

    def _failed(self, address: str, user: str | None) -> None:
        # %r escapes control characters a forged user name could carry into the log.
        log.warning("console sign-in failed: user %r from %s", user, address)
        if self._failures.failed(address):
            # Once per window, not per refused request: a blocked client cannot flood the log.
            log.warning(
                "console sign-ins from %s refused until %.0f s after its first failure: "
                "too many failures",
                address,
                self._failures.window,
            )


class ProxyAuth(Auth):
    """The user named in a header set by an authenticating proxy (oauth2-proxy, an ingress),
    accepted only from the proxy's own addresses: from anywhere else the header could be
    forged, so the request is refused."""

    name = "proxy"

    def __init__(self, header: str, trusted: Iterable[str]) -> None:
        self._header = header.lower()
        try:
            self._trusted = [ipaddress.ip_network(t, strict=False) for t in trusted]
        except ValueError as exc:
            raise ConfigError(f"trusted proxy address: {exc}") from None
        if not self._trusted:
            raise ConfigError("proxy auth needs at least one trusted proxy address")

    def identify(self, client: str | None, headers: Mapping[str, str]) -> str | Refusal:
        try:
            address = ipaddress.ip_address(client or "")
        except ValueError:
            return Refusal(403, "request not from a trusted proxy")
        if not any(address in net for net in self._trusted):
            return Refusal(403, "request not from a trusted proxy")
        user = headers.get(self._header, "").strip()
        if not user or len(user) > 200 or not user.isprintable():
            return Refusal(401, "the proxy named no user")
        return user
