"""Reading times Python cannot hold: ``-infinity``, ``infinity``, and years past 9999.

PostgreSQL's timestamptz holds ``-infinity``, ``infinity`` and years 4713 BC to 294276 AD;
Python's datetime holds years 1 to 9999, and psycopg refuses to load anything else (``timestamp
too large (after year 10K)``). Such a row (written before the database refused them, or by
the owner) must not make a reader fail, nor a worker's claim or settle: every statement
leaseq runs loads timestamptz with :class:`EndlessLoader`, which reads a time past 9999 (or
``infinity``) as :data:`AFTER_ALL` and one before year 1 (or ``-infinity``) as
:data:`BEFORE_ALL`. Readers show those two as ``infinity`` and ``-infinity`` (:func:`label`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import psycopg
from psycopg import abc, postgres
from psycopg.adapt import AdaptersMap, Buffer, Loader
from psycopg.pq import Format

__all__ = ["AFTER_ALL", "BEFORE_ALL", "EndlessLoader", "label", "register", "seconds_label"]

#: What a time past year 9999, or ``infinity``, reads as.
AFTER_ALL = datetime.max.replace(tzinfo=UTC)
#: What a time before year 1, or ``-infinity``, reads as.
BEFORE_ALL = datetime.min.replace(tzinfo=UTC)

_OID = postgres.types["timestamptz"].oid


def _psycopg_loader(fmt: Format) -> type[abc.Loader]:
    found = psycopg.adapters.get_loader(_OID, fmt)
    if found is None:  # psycopg registers both formats of every built-in type
        raise RuntimeError(f"psycopg has no timestamptz loader for {fmt.name}")
    return found


class EndlessLoader(Loader):
    """psycopg's own timestamptz loader (text), but a time it cannot load is read as
    :data:`AFTER_ALL` or :data:`BEFORE_ALL` instead of raising."""

    format = Format.TEXT
    _base: type[abc.Loader] = _psycopg_loader(Format.TEXT)

    def __init__(self, oid: int, context: abc.AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._inner = self._base(oid, context)

    def load(self, data: Buffer) -> datetime:
        try:
            moment: datetime = self._inner.load(data)
            return moment
        except psycopg.DataError:
            return BEFORE_ALL if self._early(bytes(data)) else AFTER_ALL

    @staticmethod
    def _early(data: bytes) -> bool:
        # "-infinity", or a year before 1: "0044-03-15 00:00:00+00 BC".
        return data.startswith(b"-") or data.endswith(b"BC")


class EndlessBinaryLoader(EndlessLoader):
    """The same for the binary format (microseconds since 2000-01-01, a signed integer)."""

    format = Format.BINARY
    _base = _psycopg_loader(Format.BINARY)

    @staticmethod
    def _early(data: bytes) -> bool:
        return int.from_bytes(data[:8], "big", signed=True) < 0


def register(adapters: AdaptersMap) -> None:
    """Load timestamptz in ``adapters`` (a cursor's) with the endless loaders."""
    adapters.register_loader(_OID, EndlessLoader)
    adapters.register_loader(_OID, EndlessBinaryLoader)


def label(moment: datetime) -> str | None:
    """``infinity`` or ``-infinity`` for the two times that stand for what Python cannot hold
    (:data:`AFTER_ALL`, :data:`BEFORE_ALL`); None for any other time."""
    if moment == AFTER_ALL:
        return "infinity"
    if moment == BEFORE_ALL:
        return "-infinity"
    return None


def seconds_label(seconds: float) -> str | None:
    """``infinite`` or ``-infinite`` for an age that is not a number of seconds (measured
    from an infinite time); None for a finite one."""
    if math.isfinite(seconds):
        return None
    return "infinite" if seconds > 0 else "-infinite"
