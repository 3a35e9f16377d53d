"""A page's query or a form's fields as the console face takes them: a blank field is None,
and a time or a whole number that does not parse is an InvalidJob naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from leaseq.core.errors import InvalidJob


def blank(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


def time_field(name: str, value: str | None) -> datetime | None:
    text = blank(value)
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidJob(name, "not a time (write 2026-12-01T14:00 or 2026-12-01)") from None


def int_field(name: str, value: str | None) -> int | None:
    text = blank(value)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidJob(name, "not a whole number") from None


def dead_filters(source: Mapping[str, Any]) -> dict[str, str | None]:
    """The dead-letter page's filters, read the same from its query and its retry form."""
    return {
        "queue": blank(source.get("queue")),
        "job_type": blank(source.get("job_type")),
        "error_code": blank(source.get("error_code")),
    }
