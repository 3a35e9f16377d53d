"""Who may open the console: nobody but this machine, basic auth, or a trusted proxy.

Each mode answers one question per request: the name of the person (the *actor*, written into
``leaseq.console_audit`` with every action), or a refusal. Passwords are compared in constant
time and never logged or shown; a failed basic sign-in is logged with its user name and
client address, and a user, an address or the pair of them that fails too often is refused for
a while (:mod:`leaseq.console.throttle`). The client address is the peer's, or the one a
trusted proxy names (:mod:`leaseq.console.forwarded`).
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

from starlette.datastructures import Headers

from leaseq.console.forwarded import TrustedProxies
from leaseq.console.throttle import FailedLogins, Limit
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
    """An authentication mode: :meth:`identify` returns the actor's name or a Refusal, given
    the address of the peer that sent the request and its headers."""

    name = "auth"

    def identify(
        self, client: str | None, headers: Headers
    ) -> str | Refusal:  # pragma: no cover - interface
        raise NotImplementedError


class LocalOnly(Auth):
    """No authentication: only for a console bound to loopback, and every request must come
    from this machine (a mounted console behind some other listener refuses the rest)."""

    name = "none"

    def identify(self, client: str | None, headers: Headers) -> str | Refusal:
        if not is_loopback(client):
            return Refusal(403, "this console has no authentication and answers only this machine")
        # A page of another site whose name was re-pointed at 127.0.0.1 (DNS rebinding) would
        # be "this machine" too, and same-origin with the console: its Host header gives it
        # away.
        if not is_loopback(_hostname(headers.get("host", ""))):
            return Refusal(403, "this console answers only to a loopback address (127.0.0.1)")
        return "local"


class BasicAuth(Auth):
    """HTTP basic authentication against fixed users (from a Secret: a file or variables).
    Failures are counted per user and per client address: the peer's, or the one named in
    X-Forwarded-For by a peer among ``trusted_proxies`` (addresses or networks)."""

    name = "basic"

    def __init__(
        self,
        users: Mapping[str, str],
        realm: str = "leaseq console",
        failures: FailedLogins | None = None,
        trusted_proxies: Iterable[str] = (),
    ) -> None:
        if not users or any(not u or not p for u, p in users.items()):
            raise ConfigError("basic auth needs at least one user, each with a non-empty password")
        self._users = dict(users)
        self._realm = realm
        self._failures = FailedLogins() if failures is None else failures
        self._proxies = TrustedProxies(trusted_proxies)

    @classmethod
    def from_file(cls, path: str | Path, trusted_proxies: Iterable[str] = ()) -> BasicAuth:
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
        return cls(users, trusted_proxies=trusted_proxies)

    def identify(self, client: str | None, headers: Headers) -> str | Refusal:
        challenge = {"WWW-Authenticate": f'Basic realm="{self._realm}", charset="UTF-8"'}
        header = headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return Refusal(401, "sign in to use the console", challenge)
        address = self._proxies.client(client, headers.getlist("x-forwarded-for")) or "unknown"
        user: str | None
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, sep, password = None, "", ""
        blocked = self._refused(user, address)
        if blocked:
            # Checked before the password, so a refused guess learns nothing about it.
            return blocked
        if user is None:
            return self._failed(None, address, Refusal(401, "malformed credentials", challenge))
        expected = self._users.get(user, "")
        # Compare even for unknown users, so timing does not tell which users exist.
        good = hmac.compare_digest(password.encode(), expected.encode() or b"\0" * 16)
        if not (sep and user in self._users and good):
            return self._failed(user, address, Refusal(401, "wrong user or password", challenge))
        self._failures.succeeded(user, address)
        return user

    def _refused(self, user: str | None, address: str) -> Refusal | None:
        wait = self._failures.blocked_for(user, address)
        if wait <= 0:
            return None
        retry = str(math.ceil(wait))
        return Refusal(
            429, f"too many failed sign-ins: try again in {retry} s", {"Retry-After": retry}
        )

    def _failed(self, user: str | None, address: str, refusal: Refusal) -> Refusal:
        # %r escapes control characters a forged user name could carry into the log.
        log.warning("console sign-in failed: user %r from %s", user, address)
        for limit in self._failures.failed(user, address):
            # Once per window, not per refused request: a blocked client cannot flood the log.
            log.warning(
                "console sign-ins of %s refused until %.0f s after its first failure: "
                "too many failures",
                _REFUSED[limit].format(user=repr(user), address=address),
                self._failures.window,
            )
        return refusal


#: Who a filled limit refuses, for the log.
_REFUSED = {
    Limit.PAIR: "user {user} from {address}",
    Limit.ADDRESS: "any user from {address} (but where one signed in before)",
    Limit.USER: "user {user} (but from where it signed in before)",
}


class ProxyAuth(Auth):
    """The user named in a header set by an authenticating proxy (oauth2-proxy, an ingress),
    accepted only from the proxy's own addresses: from anywhere else the header could be
    forged, so the request is refused."""

    name = "proxy"

    def __init__(self, header: str, trusted: Iterable[str]) -> None:
        self._header = header.lower()
        self._trusted = TrustedProxies(trusted)
        if not self._trusted:
            raise ConfigError("proxy auth needs at least one trusted proxy address")

    def identify(self, client: str | None, headers: Headers) -> str | Refusal:
        if client not in self._trusted:
            return Refusal(403, "request not from a trusted proxy")
        user = headers.get(self._header, "").strip()
        if not user or len(user) > 200 or not user.isprintable():
            return Refusal(401, "the proxy named no user")
        return user
