"""Making what leaseq stores or logs bounded and storable, and saying what was changed.

PostgreSQL refuses U+0000 in text and jsonb (common in PDF and OCR output), and psycopg
cannot send lone surrogates; an unbounded exception message (5 MB was seen) would be stored
and logged whole. Every error, reason, result, progress and checkpoint goes through here
before it is written, so an outcome can always be recorded: nothing is refused, what had to
change is replaced or cut, and the note says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: Longest error or reason stored (characters, before the note about the cut).
MAX_ERROR_CHARS = 8192

_NUL = "\x00"
_REPLACEMENT = "\ufffd"
# C0 controls and DEL, except tab, newline and carriage return: escaped as \xNN in text.
_CONTROL = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


@dataclass(frozen=True)
class Bounded:
    """A value made storable; ``note`` says what was changed (None: nothing was)."""

    value: Any
    note: str | None = None


_NULL = Bounded(None)


def _count(parts: list[str]) -> str | None:
    return "; ".join(parts) if parts else None


def text(value: str, limit: int = MAX_ERROR_CHARS) -> Bounded:
    """``value`` with NULs and lone surrogates replaced by U+FFFD, other control characters
    (but tab and newlines) escaped as ``\\xNN``, and cut to ``limit`` characters. When
    anything changed, the text ends with a bracketed note saying what, and ``note`` holds it."""
    total = len(value)
    cut = total > limit
    if cut:
        value = value[:limit]
    nuls = value.count(_NUL)
    surrogates = len(_SURROGATE.findall(value))
    controls = len(_CONTROL.findall(value))
    if nuls:
        value = value.replace(_NUL, _REPLACEMENT)
    if surrogates:
        value = _SURROGATE.sub(_REPLACEMENT, value)
    if controls:
        value = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", value)
    parts = []
    if cut:
        parts.append(f"cut: {total} characters in all, the first {limit} kept")
    if nuls:
        parts.append(f"{nuls} NUL replaced by U+FFFD")
    if surrogates:
        parts.append(f"{surrogates} unpaired surrogates replaced by U+FFFD")
    if controls:
        parts.append(f"{controls} control characters escaped")
    note = _count(parts)
    return Bounded(f"{value} [{note}]" if note else value, note)


def json(value: Any, what: str) -> Bounded:
    """A JSON value with NULs and lone surrogates in its strings (keys included) replaced by
    U+FFFD, which jsonb cannot store; ``note`` names ``what`` and how many. Size is not
    capped here: :func:`leaseq.core.validation.json_value` refuses oversized values."""
    if value is None:
        return _NULL  # most handlers return nothing and report no progress: no walk
    counts = {"nul": 0, "surrogate": 0}

    def clean(s: str) -> str:
        if _NUL in s:
            counts["nul"] += s.count(_NUL)
            s = s.replace(_NUL, _REPLACEMENT)
        if _SURROGATE.search(s):
            counts["surrogate"] += len(_SURROGATE.findall(s))
            s = _SURROGATE.sub(_REPLACEMENT, s)
        return s

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return clean(v)
        if isinstance(v, dict):
            return {clean(str(k)) if isinstance(k, str) else k: walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    cleaned = walk(value)
    parts = []
    if counts["nul"]:
        parts.append(f"{counts['nul']} NUL")
    if counts["surrogate"]:
        parts.append(f"{counts['surrogate']} unpaired surrogates")
    if not parts:
        return Bounded(value)
    return Bounded(cleaned, f"{what}: {' and '.join(parts)} replaced by U+FFFD")
