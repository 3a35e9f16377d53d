"""Checks on what callers pass in, before anything is written. Each error names its field."""

from __future__ import annotations

import json
import math
import re
import sys
from datetime import datetime
from typing import Any

from leaseq.core import bounded
from leaseq.core.errors import InvalidJob
from leaseq.core.models import MAX_STREAM_ITEMS

MAX_NAME_LENGTH = 128
# Queue names end up in metric labels, log lines, terminal tables and Kubernetes specs; the
# schema's jobs_queue_name constraint says the same.
QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
QUEUE_NAME_RULE = (
    f"1-{MAX_NAME_LENGTH} characters of letters, digits and . _ : -, "
    "starting with a letter or digit"
)
MAX_PAYLOAD_BYTES = 1_048_576
#: Longest step name (characters); the table's CHECK says the same.
MAX_STEP_NAME = 200
PRIORITY_RANGE = (-32768, 32767)


def name(field: str, value: object) -> str:
    """A queue or job type name: a non-empty string of at most 128 characters. None is
    empty, as the SQL function's NULL is (the same words on both faces)."""
    if value is None:
        raise InvalidJob(field, "must not be empty")
    if not isinstance(value, str):
        raise InvalidJob(field, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidJob(field, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidJob(field, f"is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}")
    return value


def queue_name(value: object, field: str = "queue") -> str:
    """A queue name: :data:`QUEUE_NAME_RULE`. The error quotes the name with escapes."""
    checked = name(field, value)
    if not QUEUE_NAME.fullmatch(checked):
        raise InvalidJob(field, f"{checked!r} is not a queue name: {QUEUE_NAME_RULE}")
    return checked


def json_value(field: str, value: Any, *, limit: int = MAX_PAYLOAD_BYTES) -> Any:
    """A value that serialises to strict JSON (no NaN/Infinity) within ``limit`` bytes."""
    if value is None:
        return value  # JSON null: 4 bytes, nothing to serialise (the commonest result)
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(field, f"is not JSON-serialisable ({exc})") from exc
    size = len(encoded.encode())
    if size > limit:
        raise InvalidJob(field, f"is {size} bytes as JSON; the limit is {limit}")
    return value


def json_text(field: str, text: str) -> Any:
    """``text`` parsed as JSON; InvalidJob naming ``field`` when it is not JSON, or nests
    deeper than Python's parser recurses (which raises RecursionError, not a JSON error)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidJob(field, f"is not JSON ({exc})") from exc
    except RecursionError as exc:
        raise InvalidJob(field, "nests too deeply to be read") from exc


def step_resolution(
    step: str, result: Any, *, retry: bool, actor: str, reason: str
) -> tuple[Any, str, str]:
    """The checked (result, actor, reason) of settling step ``step`` (every face that settles
    one: Queue, AsyncQueue, the console): InvalidJob when the actor is no name, the reason is
    blank or the result no JSON of at most :data:`MAX_PAYLOAD_BYTES`."""
    if not isinstance(step, str) or not 1 <= len(step) <= MAX_STEP_NAME:
        shown = f"{len(step)} characters" if isinstance(step, str) else type(step).__name__
        raise InvalidJob("step", f"must be a name of 1-{MAX_STEP_NAME} characters, got {shown}")
    actor = name("actor", actor)
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidJob("reason", "must say why the step is settled so (it is audited)")
    reason = bounded.text(reason, 2000).value
    if not retry:
        json_value(f"step {step!r} result", result)
        result = bounded.json(result, f"step {step!r} result").value
    return result, actor, reason


def non_negative(field: str, value: float) -> float:
    if not finite_number(value):
        raise InvalidJob(field, f"must be a finite number, got {number_text(value)}")
    if value < 0:
        raise InvalidJob(field, f"must not be negative, got {value}")
    return float(value)


def positive(field: str, value: float) -> float:
    if non_negative(field, value) == 0:
        raise InvalidJob(field, "must be greater than zero")
    return float(value)


#: The longest lease one claim or renewal takes (a day); the database caps it there too.
MAX_LEASE_SECONDS = 86_400


def lease_seconds(value: float) -> float:
    """A lease's length: more than zero, at most :data:`MAX_LEASE_SECONDS` (renew a longer
    job's lease with heartbeats)."""
    if positive("lease_seconds", value) > MAX_LEASE_SECONDS:
        raise InvalidJob(
            "lease_seconds",
            f"must be at most {MAX_LEASE_SECONDS} (a day; a longer job renews its lease), "
            f"got {value:g}",
        )
    return float(value)


#: The furthest a job's start, delay or timeout may reach (3,650 days), as the database checks.
MAX_HORIZON_SECONDS = 315_360_000
#: The most attempts a job may have, as the database checks.
MAX_ATTEMPTS = 1000


def within_horizon(field: str, value: float) -> float:
    """A finite, non-negative number of seconds of at most :data:`MAX_HORIZON_SECONDS`."""
    if non_negative(field, value) > MAX_HORIZON_SECONDS:
        raise InvalidJob(
            field, f"must be at most {MAX_HORIZON_SECONDS} seconds (3650 days), got {value}"
        )
    return float(value)


def wake_time(field: str, value: object, now: datetime) -> datetime:
    """A timezone-aware datetime at most :data:`MAX_HORIZON_SECONDS` after ``now`` (one in
    the past is due at once)."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidJob(field, f"must be a timezone-aware datetime, got {value!r}")
    if (value - now).total_seconds() > MAX_HORIZON_SECONDS:
        raise InvalidJob(field, f"must be at most 3650 days away, got {value.isoformat()}")
    return value


#: Longest signal name (characters); leaseq.signal and the table's CHECK say the same.
MAX_SIGNAL_NAME = 200
#: Largest signal payload, as JSON (bytes), as a stream item's.
MAX_SIGNAL_BYTES = 65_536
#: Signals one job holds at most, and bytes of their payloads (as JSON): the database
#: refuses the signal past either (leaseq.job_signals_wake), whoever sends it.
MAX_SIGNALS_PER_JOB = 1_000
MAX_SIGNAL_BYTES_PER_JOB = 4_194_304


def signal_name(field: str, value: object) -> str:
    """A signal's name: a string of 1-:data:`MAX_SIGNAL_NAME` characters."""
    if not isinstance(value, str) or value == "":
        raise InvalidJob(field, f"must be a non-empty string, got {value!r}")
    if len(value) > MAX_SIGNAL_NAME:
        raise InvalidJob(field, f"is {len(value)} characters long; the limit is {MAX_SIGNAL_NAME}")
    return value


def attempts(field: str, value: int) -> int:
    """An integer number of attempts in [1, :data:`MAX_ATTEMPTS`]."""
    if at_least(field, value, 1) > MAX_ATTEMPTS:
        raise InvalidJob(field, f"must be at most {MAX_ATTEMPTS}, got {value}")
    return value


def at_least(field: str, value: int, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidJob(field, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidJob(field, f"must be at least {minimum}, got {value}")
    return value


def stream_window(after: int, page: int, page_field: str) -> None:
    """A read of a job's stream: ``after`` an offset (0 to 2**63 - 1, the items' bigint) and
    the page (named ``page_field``) 1 to MAX_STREAM_ITEMS, the most items a stream holds, so
    no read asks the database for a number it cannot take."""
    at_least("after", after, 0)
    if after > 2**63 - 1:
        raise InvalidJob("after", f"must be an offset of at most {2**63 - 1}, got {after}")
    at_least(page_field, page, 1)
    if page > MAX_STREAM_ITEMS:
        raise InvalidJob(
            page_field, f"must be at most {MAX_STREAM_ITEMS} (a stream's items), got {page}"
        )


def priority(value: int) -> int:
    low, high = PRIORITY_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidJob("priority", f"must be an integer in [{low}, {high}], got {value!r}")
    return value


def optional_key(field: str, value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidJob(field, "must be a non-empty string or None")
    if len(value) > 512:
        raise InvalidJob(field, f"is {len(value)} characters long; the limit is 512")
    return value


def flow_key(field: str, value: str | None) -> str | None:
    """A flow-control key or ordering key: None, or 1-200 characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidJob(field, "must be a non-empty string or None")
    if len(value) > 200:
        raise InvalidJob(field, f"is {len(value)} characters long; the limit is 200")
    return value


def finite_number(value: object) -> bool:
    """True for an int or float (not a bool) that a float (PostgreSQL's double precision)
    holds: not NaN or an infinity, and not an int beyond a float's range (on which
    ``math.isfinite`` would raise OverflowError). Never raises."""
    if isinstance(value, float):
        return math.isfinite(value)
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return abs(value) <= sys.float_info.max


def number_text(value: object) -> str:
    """``value`` as the error shows it: a non-finite float spelt as PostgreSQL spells it
    (NaN, Infinity, -Infinity), so Python and ``leaseq.enqueue`` say the same words; an int
    too large for a float by its size (its digits may be too many for ``repr``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, int) and not isinstance(value, bool) and not finite_number(value):
        return f"an integer of {value.bit_length()} bits"
    return repr(value)
