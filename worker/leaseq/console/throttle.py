"""Failed sign-ins counted so a password cannot be guessed at full speed, from one address or
from many, and so guessing cannot cheaply lock a person out.

Each failure counts three times, each count in its own window of :data:`WINDOW_SECONDS` from
its first failure:

- against the pair (user name, client address): :data:`PAIR_FAILURES`. The limit a person who
  mistypes meets, and the one that always holds.
- against the client address, whatever the name: :data:`ADDRESS_FAILURES`, so one address
  cannot try many names at the pair limit each.
- against the user name, whatever the address: :data:`USER_FAILURES`, so guesses spread over
  many addresses (or over the many clients of a trusted proxy) get that many per window per
  user, not the pair limit per address.

The per-user count alone would let anyone lock a person out from anywhere. So a pair that
signed in within :data:`KNOWN_SECONDS` (a *known* pair: the person's own address) is held by
its pair limit only: the person keeps signing in from where they did before while someone
else uses up the user's budget (or the budget of an address they share, an office's NAT), and
guesses from that very address still get only the pair limit. On an address they never signed
in from they wait for the window, while the guessing lasts. Names are counted as given, known
to the console or not, so a refusal tells nobody which users exist.

Memory is bounded whatever is sent: each of the four tables (failing pairs, addresses and
users; known pairs) keeps at most ``max_entries`` keys, the least recently changed forgotten
first, and a name is kept as a 16-byte digest. Only a right password makes a pair known, so
guessing cannot push a person's address out of the known pairs; pushing a user's count out
takes ``max_entries`` failures of other names within its window, which the address limit makes
cost ``max_entries / ADDRESS_FAILURES`` addresses. The counts live in the process: each console
replica keeps its own.
"""

from __future__ import annotations

import enum
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

#: Failed sign-ins allowed per (user, address) within one window.
PAIR_FAILURES = 5
#: Failed sign-ins allowed per address, whatever the user name, within one window.
ADDRESS_FAILURES = 20
#: Failed sign-ins allowed per user name, from addresses it has not signed in from.
USER_FAILURES = 20
#: The window, in seconds: counted from a key's first failure in it.
WINDOW_SECONDS = 60.0
#: How long a pair that signed in stays known (held by its pair limit only).
KNOWN_SECONDS = 7 * 24 * 3600.0
#: Keys remembered at most, per table.
MAX_ENTRIES = 10_000

K = TypeVar("K", bound=Hashable)


class Limit(enum.Enum):
    """Which count a failure filled."""

    PAIR = "pair"
    ADDRESS = "address"
    USER = "user"


class _Counts(Generic[K]):
    """Failures per key within a window from the key's first, at most ``max_entries`` keys (the
    least recently failing forgotten first). Not locked: :class:`FailedLogins` locks."""

    def __init__(self, limit: int, window: float, max_entries: int) -> None:
        self._limit = limit
        self._window = window
        self._max = max_entries
        self._seen: OrderedDict[K, tuple[float, int]] = OrderedDict()

    def blocked_for(self, key: K, now: float) -> float:
        """Seconds ``key`` stays refused (0: it is not)."""
        entry = self._seen.get(key)
        if entry is None:
            return 0.0
        start, count = entry
        left = start + self._window - now
        if left <= 0:
            del self._seen[key]
            return 0.0
        return left if count >= self._limit else 0.0

    def add(self, key: K, now: float) -> bool:
        """Count one failure of ``key``; True when this one fills its limit."""
        start, count = self._seen.pop(key, (now, 0))
        if now - start >= self._window:
            start, count = now, 0
        self._seen[key] = (start, count + 1)
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return count + 1 == self._limit

    def forget(self, key: K) -> None:
        self._seen.pop(key, None)

    def __len__(self) -> int:
        return len(self._seen)


def _name(user: str) -> bytes:
    # A fixed-size key, however long the name a request sends.
    return hashlib.blake2b(user.encode(errors="surrogatepass"), digest_size=16).digest()


class FailedLogins:
    """Failed sign-ins per (user, address), per address and per user (the module's rules):
    a refused key answers every sign-in, right or wrong, until its window ends."""

    def __init__(
        self,
        *,
        pair_limit: int = PAIR_FAILURES,
        address_limit: int = ADDRESS_FAILURES,
        user_limit: int = USER_FAILURES,
        window: float = WINDOW_SECONDS,
        known_seconds: float = KNOWN_SECONDS,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window
        self._known_seconds = known_seconds
        self._max = max_entries
        self._clock = clock
        self._pairs: _Counts[tuple[bytes, str]] = _Counts(pair_limit, window, max_entries)
        self._addresses: _Counts[str] = _Counts(address_limit, window, max_entries)
        self._users: _Counts[bytes] = _Counts(user_limit, window, max_entries)
        self._known: OrderedDict[tuple[bytes, str], float] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def window(self) -> float:
        """Seconds a key stays refused, counted from its first failure."""
        return self._window

    def blocked_for(self, user: str | None, address: str) -> float:
        """Seconds until ``user`` may try again from ``address`` (0: it may now). ``None``: the
        request named no user, so only the address's count applies."""
        with self._lock:
            now = self._clock()
            if user is None:
                return self._addresses.blocked_for(address, now)
            pair = (_name(user), address)
            wait = self._pairs.blocked_for(pair, now)
            if self._is_known(pair, now):
                return wait
            return max(
                wait,
                self._addresses.blocked_for(address, now),
                self._users.blocked_for(pair[0], now),
            )

    def failed(self, user: str | None, address: str) -> tuple[Limit, ...]:
        """Count one failed sign-in of ``user`` from ``address``; the limits this one filled
        (each is filled once per window, so a caller can log it once)."""
        with self._lock:
            now = self._clock()
            filled = []
            if user is not None:
                name = _name(user)
                if self._pairs.add((name, address), now):
                    filled.append(Limit.PAIR)
                if self._users.add(name, now):
                    filled.append(Limit.USER)
            if self._addresses.add(address, now):
                filled.append(Limit.ADDRESS)
            return tuple(filled)

    def succeeded(self, user: str, address: str) -> None:
        """``user`` signed in from ``address``: forget the pair's failures and know the pair.
        The user's and the address's counts stay: a right password does not buy anyone else
        more guesses."""
        pair = (_name(user), address)
        with self._lock:
            self._pairs.forget(pair)
            self._known.pop(pair, None)
            self._known[pair] = self._clock()
            while len(self._known) > self._max:
                self._known.popitem(last=False)

    def _is_known(self, pair: tuple[bytes, str], now: float) -> bool:
        since = self._known.get(pair)
        if since is None:
            return False
        if now - since >= self._known_seconds:
            del self._known[pair]
            return False
        return True

    def __len__(self) -> int:
        """Keys remembered, all tables together (bounded by four times ``max_entries``)."""
        return len(self._pairs) + len(self._addresses) + len(self._users) + len(self._known)
