"""The proxies the console believes (``--trusted-proxy``), and the client a request names.

A request from a trusted proxy names its client in ``X-Forwarded-For``: each proxy appends the
address it got the request from, so the list is read from the right, past the trusted proxies'
own addresses, and the first other address is the client; whatever the client wrote into the
header itself sits further left and is never reached. A request from any other peer is its own
client: its header could say anything. With no trusted proxy every peer is its own client.

This is the rule of uvicorn's ``ProxyHeadersMiddleware`` (``forwarded_allow_ips``). The console
does not run that middleware: it replaces the peer's address in the request, and the loopback
check of ``--auth none`` and the proxy check of ``--auth proxy`` must see the peer itself; it
also takes ``X-Forwarded-Proto``, and it keeps an entry it cannot parse as a name to compare.
Here an entry of ``--trusted-proxy`` that is no address or network is refused at start-up, and
a forwarded entry that is no address names no client (the peer is used instead), so only an
address ever becomes a client's identity.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from leaseq.core.errors import ConfigError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_address(text: str) -> Address | None:
    """The address in ``text``: ``10.0.0.7``, ``10.0.0.7:5123``, ``::1`` or ``[::1]:5123``
    (an IPv4 address mapped into IPv6 as its IPv4 self); None when it is none of these."""
    text = text.strip()
    port = ""
    if text.startswith("["):
        text, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    elif text.count(":") == 1:
        text, _, port = text.partition(":")
    if port and not port.isdigit():
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class TrustedProxies:
    """Addresses and networks whose ``X-Forwarded-For`` the console believes."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        networks = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                raise ConfigError(
                    f"--trusted-proxy {entry!r} is not an address or network "
                    "(such as 10.0.0.7 or 10.0.0.0/8)"
                ) from None
        self._networks = tuple(networks)

    def __bool__(self) -> bool:
        return bool(self._networks)

    def __contains__(self, host: object) -> bool:
        return self._trusts(parse_address(host) if isinstance(host, str) else None)

    def _trusts(self, address: Address | None) -> bool:
        return address is not None and any(address in net for net in self._networks)

    def client(self, peer: str | None, forwarded_for: Sequence[str]) -> str | None:
        """The client's address: the right-most address of ``forwarded_for`` (the values of
        every X-Forwarded-For header, in order) that is not a trusted proxy's, when ``peer`` is
        one; ``peer`` itself otherwise, or when the header names no address there."""
        if peer not in self:
            return peer
        entries = [e for value in forwarded_for for e in value.split(",")]
        for entry in reversed(entries):
            address = parse_address(entry)
            if address is None:
                return peer
            if not self._trusts(address):
                return str(address)
        # Every hop is a trusted proxy: the first one is where the request started.
        first = parse_address(entries[0]) if entries else None
        return peer if first is None else str(first)
