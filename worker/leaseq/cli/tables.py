"""Output for the CLI: aligned text tables for people, JSON for scripts."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from leaseq.core import moments
from leaseq.core.redact import redact


def age(seconds: float | None) -> str:
    """``None`` -> ``-``; an age from an infinite time -> ``infinite`` (or ``-infinite``);
    otherwise a short human duration: 4s, 3m12s, 2h05m, 3d04h."""
    if seconds is None:
        return "-"
    endless = moments.seconds_label(seconds)
    if endless is not None:
        return endless
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def when(moment: datetime | None) -> str:
    """A time in local time, ``-`` for None, ``infinity``/``-infinity`` for a time Python
    cannot hold (:mod:`leaseq.core.moments`)."""
    if moment is None:
        return "-"
    return moments.label(moment) or moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


# C0 and C1 control characters, DEL, and the Unicode marks that reorder text (bidi
# overrides and isolates): a queue name, worker id or error from the database must not move
# the cursor, recolour the terminal or disguise what is printed next to it.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """``str(value)`` with every control character shown as an escape (``\\x1b``, ``\\n``)
    and anything shaped like a password masked (a handler's error may quote a URL)."""

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(
            match.group(), f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
        )

    return _UNPRINTABLE.sub(escape, redact(str(value)))


def cancelled_counts(pending: int, running: int) -> str:
    """How many of the jobs a cancel reached had not started and how many were running,
    as a clause of the cancel commands' answers (the running ones' workers are fenced)."""
    fenced = " (their workers are now fenced)" if running else ""
    return f"{pending} had not started, {running} were running{fenced}"


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    """``name  value`` lines, names padded to one width, values escaped like table cells."""
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name.ljust(width)}  {printable(value)}" for name, value in pairs)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; numbers right-aligned; control
    characters in any cell escaped (:func:`printable`)."""
    cells = [
        [printable(c) for c in headers],
        *[["-" if c is None else printable(c) for c in r] for r in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        any(isinstance(r[i], int | float) for r in rows)
        and all(r[i] is None or isinstance(r[i], int | float) for r in rows)
        for i in range(len(headers))
    ]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(width) if is_num else cell.ljust(width)
            for cell, width, is_num in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, datetime):
        return moments.label(value) or value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and moments.seconds_label(value) is not None:
        return moments.seconds_label(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def to_json(value: Any) -> str:
    """Dataclasses, datetimes (ISO 8601) and containers as indented JSON."""
    return json.dumps(_plain(value), indent=2, default=str)
