"""The console's sign-in throttle (per user, per address and per pair of them, a known pair held
by its own limit only) and the client address a trusted proxy names in X-Forwarded-For."""

from __future__ import annotations

import pytest

from leaseq.console.forwarded import TrustedProxies, parse_address
from leaseq.console.throttle import FailedLogins, Limit
from leaseq.core.errors import ConfigError


class Clock:
    """Time the throttle reads, moved by the test (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fail(failures: FailedLogins, user: str | None, address: str, times: int) -> list[Limit]:
    filled: list[Limit] = []
    for _ in range(times):
        filled.extend(failures.failed(user, address))
    return filled


def test_a_pair_is_refused_after_its_limit_and_others_are_not() -> None:
    clock = Clock()
    failures = FailedLogins(clock=clock)
    assert _fail(failures, "ann", "10.0.0.1", 4) == []
    assert failures.blocked_for("ann", "10.0.0.1") == 0
    assert _fail(failures, "ann", "10.0.0.1", 1) == [Limit.PAIR]
    assert failures.blocked_for("ann", "10.0.0.1") == 60
    assert failures.blocked_for("ann", "10.0.0.2") == 0  # the same user elsewhere
    assert failures.blocked_for("bob", "10.0.0.1") == 0  # another user from there
    clock.now += 59
    assert failures.blocked_for("ann", "10.0.0.1") == 1
    clock.now += 1
    assert failures.blocked_for("ann", "10.0.0.1") == 0


def test_one_address_trying_many_names_is_refused_for_every_name() -> None:
    failures = FailedLogins(clock=Clock())
    filled = [limit for n in range(20) for limit in failures.failed(f"user{n}", "10.0.0.1")]
    assert filled == [Limit.ADDRESS]
    assert failures.blocked_for("user99", "10.0.0.1") == 60
    assert failures.blocked_for(None, "10.0.0.1") == 60  # malformed credentials too
    assert failures.blocked_for("user99", "10.0.0.2") == 0


def test_guesses_spread_over_addresses_meet_the_user_limit() -> None:
    failures = FailedLogins(clock=Clock())
    filled = _fail(failures, "ann", "10.0.0.1", 4) + _fail(failures, "ann", "10.0.0.2", 4)
    for n in range(3, 6):
        filled += _fail(failures, "ann", f"10.0.0.{n}", 4)
    assert filled == [Limit.USER]
    assert failures.blocked_for("ann", "10.0.0.9") == 60  # a new address gets no guess
    assert failures.blocked_for("bob", "10.0.0.9") == 0


def test_a_known_pair_is_held_by_its_own_limit_only() -> None:
    """Guesses for ann from everywhere, and sprayed names from her own address, do not lock
    ann out where she signed in before; guesses for ann from there still meet the pair limit."""
    clock = Clock()
    failures = FailedLogins(clock=clock)
    failures.succeeded("ann", "10.0.0.1")
    for n in range(2, 7):
        _fail(failures, "ann", f"10.0.1.{n}", 4)
    _fail(failures, "mallory", "10.0.0.1", 4)
    for n in range(16):
        failures.failed(f"user{n}", "10.0.0.1")
    assert failures.blocked_for("ann", "10.0.9.9") == 60  # user limit: a new address waits
    assert failures.blocked_for("carl", "10.0.0.1") == 60  # address limit
    assert failures.blocked_for("ann", "10.0.0.1") == 0  # her own address still answers
    assert _fail(failures, "ann", "10.0.0.1", 5) == [Limit.PAIR]
    assert failures.blocked_for("ann", "10.0.0.1") == 60


def test_a_sign_in_clears_its_pair_only_and_is_forgotten_after_a_while() -> None:
    clock = Clock()
    failures = FailedLogins(clock=clock, known_seconds=3600)
    _fail(failures, "ann", "10.0.0.1", 4)
    failures.succeeded("ann", "10.0.0.1")
    assert _fail(failures, "ann", "10.0.0.1", 4) == []  # the pair counts from 0 again
    assert _fail(failures, "ann", "10.0.0.2", 4) == []
    assert _fail(failures, "ann", "10.0.0.3", 4) == []
    assert _fail(failures, "ann", "10.0.0.4", 4) == [Limit.USER]  # 16 + 4: none was cleared
    assert failures.blocked_for("ann", "10.0.0.1") == 0
    clock.now += 3600
    for n in range(5, 10):  # a fresh window of the user's count, filled
        _fail(failures, "ann", f"10.0.0.{n}", 4)
    assert failures.blocked_for("ann", "10.0.0.1") == 60  # no longer known


def test_names_are_counted_as_given_known_or_not() -> None:
    failures = FailedLogins(clock=Clock())
    assert _fail(failures, "nobody-here", "10.0.0.1", 5) == [Limit.PAIR]
    assert _fail(failures, "ann", "10.0.0.2", 5) == [Limit.PAIR]


def test_the_memory_is_bounded_whatever_is_sent() -> None:
    failures = FailedLogins(pair_limit=1, max_entries=100, clock=Clock())
    for n in range(5000):
        failures.failed("x" * 10_000 + str(n), f"10.0.{n // 256}.{n % 256}")
        failures.succeeded(f"user{n}", f"10.1.{n // 256}.{n % 256}")
    assert len(failures) == 400  # four tables of at most 100 keys
    last = "x" * 10_000 + "4999"
    assert failures.blocked_for(last, "10.0.19.135") > 0  # the last pair is remembered
    assert failures.blocked_for("x" * 10_000 + "0", "10.0.0.0") == 0  # the first forgotten


PROXIES = TrustedProxies(["10.0.0.0/8", "192.0.2.7"])


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("10.1.1.1", ["203.0.113.5"], "203.0.113.5"),
        # What the client wrote itself is left of what the proxy appended: never reached.
        ("10.1.1.1", ["198.51.100.1, 203.0.113.5"], "203.0.113.5"),
        # Two proxies: past the trusted hops from the right.
        ("192.0.2.7", ["198.51.100.1, 203.0.113.5, 10.2.2.2"], "203.0.113.5"),
        # Several header lines are one list, in order.
        ("10.1.1.1", ["198.51.100.1", "203.0.113.5"], "203.0.113.5"),
        ("10.1.1.1", ["203.0.113.5:4711"], "203.0.113.5"),
        ("10.1.1.1", ["[2001:db8::1]:4711"], "2001:db8::1"),
        ("10.1.1.1", ["2001:DB8:0::1"], "2001:db8::1"),
        ("::ffff:10.1.1.1", ["203.0.113.5"], "203.0.113.5"),
        # Every hop trusted: the first is where the request started.
        ("10.1.1.1", ["10.3.3.3, 10.2.2.2"], "10.3.3.3"),
        # No header, or one that names no address where it counts: the peer.
        ("10.1.1.1", [], "10.1.1.1"),
        ("10.1.1.1", ["203.0.113.5, unknown"], "10.1.1.1"),
        ("10.1.1.1", [""], "10.1.1.1"),
        # Not from a trusted proxy: the header could say anything.
        ("198.51.100.9", ["203.0.113.5"], "198.51.100.9"),
        ("10.1.1.1.evil", ["203.0.113.5"], "10.1.1.1.evil"),
        (None, ["203.0.113.5"], None),
    ],
)
def test_the_client_address(peer: str | None, forwarded: list[str], client: str | None) -> None:
    assert PROXIES.client(peer, forwarded) == client


def test_no_trusted_proxy_believes_no_header() -> None:
    none = TrustedProxies()
    assert not none
    assert none.client("127.0.0.1", ["203.0.113.5"]) == "127.0.0.1"


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "ingress-nginx", "*", ""])
def test_an_entry_that_is_no_address_is_refused(entry: str) -> None:
    with pytest.raises(ConfigError, match=r"--trusted-proxy .* is not an address or network"):
        TrustedProxies(["10.0.0.1", entry])


def test_parse_address() -> None:
    assert str(parse_address(" [::1]:80 ")) == "::1"
    assert parse_address("localhost") is None
    assert parse_address("1.2.3.4:x") is None
    assert parse_address("[::1]x") is None
