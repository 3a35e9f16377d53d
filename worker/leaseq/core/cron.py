"""Cron expressions and wall-clock slots in a schedule's IANA time zone.

Parsing is croniter's (standard 5 fields, or 6 with a leading seconds field:
``*/10 * * * * *``). croniter only ever sees *naive* wall-clock times, where it is plain
calendar arithmetic; this module maps each wall-clock slot to one instant with the policy
below, so croniter's own DST handling never comes into play.

Daylight-saving policy (every wall-clock slot fires exactly once):

* **Spring forward** (a wall-clock time that does not exist, e.g. 02:30 on 29 March 2026 in
  Europe/Berlin): the slot fires once, at the first instant after the gap (03:00 CEST). Several
  slots inside the gap (``*/15``) and a slot at the gap's end all map to that one instant and
  fire as one job: the slot key is the instant.
* **Fall back** (a wall-clock time that happens twice, e.g. 02:30 on 25 October 2026 in
  Europe/Berlin): the slot fires once, at its first occurrence (02:30 CEST). The repeated hour
  fires nothing again, so an hourly schedule is two real hours apart across it. Use
  ``timezone="UTC"`` for a fixed interval in real time.

Slot instants are therefore non-decreasing in wall-clock order, which lets a tick walk back
from now and stop at the last slot it fired.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from leaseq.core.errors import InvalidJob

#: At most this many past slots are walked per schedule and tick (counting missed slots, or
#: backfilling a catch-up window): bounds a tick after a long outage of a per-second schedule.
MAX_SLOTS_WALKED = 10_000

#: Seconds between the leader's passes (the reaper's default ``--reap-interval-seconds``): a
#: schedule is ticked at most this often.
PASS_SECONDS = 5

#: ScheduleSpec's default catch-up window. A tick fires every slot this recent, so slots
#: that fell between two passes, or during a leader takeover (a 15 s lease TTL plus a pass,
#: by default), all fire, late, instead of being skipped. Three takeovers' worth.
DEFAULT_CATCHUP_SECONDS = 60.0


def check_cron(expression: object) -> str:
    """``expression`` if it is a 5-field cron or a 6-field one with a leading seconds field;
    InvalidJob naming it otherwise."""
    if not isinstance(expression, str):
        raise InvalidJob("cron", f"must be a string, got {type(expression).__name__}")
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise InvalidJob(
            "cron",
            f"{expression!r} has {len(fields)} fields; use 5 (minute hour day month weekday) "
            "or 6 with a leading seconds field",
        )
    try:
        # One step finds expressions that never match (``0 0 30 2 *``).
        croniter(expression, datetime(2000, 1, 1), second_at_beginning=True).get_next(datetime)
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidJob("cron", f"{expression!r} is not a cron expression: {exc}") from exc
    return expression


def shortest_gap(expression: str) -> int:
    """The fewest seconds between two consecutive slots of ``expression`` (a checked cron),
    or 60 when they are a minute or more apart. Only a seconds field gives less: two of its
    seconds, or its last and first across a minute when two consecutive minutes match."""
    fields = croniter(expression, datetime(2000, 1, 1), second_at_beginning=True).expanded
    if len(fields) < 6:
        return 60
    seconds = list(range(60)) if fields[5] == ["*"] else sorted(int(s) for s in fields[5])
    minutes = set(range(60)) if fields[0] == ["*"] else {int(m) for m in fields[0]}
    gaps = [b - a for a, b in itertools.pairwise(seconds)]
    if any((m + 1) % 60 in minutes for m in minutes):
        gaps.append(60 - seconds[-1] + seconds[0])
    return min([60, *gaps])


def zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Berlin``, ``UTC``); InvalidJob naming it otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidJob("timezone", f"{name!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidJob("timezone", f"{name!r} is not an IANA time zone name") from exc


def instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant of the naive wall-clock time ``wall`` in ``tz``, by the module's
    policy: an ambiguous time is its first occurrence, a skipped one the end of the gap."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first  # exists (once, or first of two)
    # In a gap: fold=1 reads it with the offset after the change, giving an instant before the
    # change; fold=0 one after it. The change itself lies between: find it to the second.
    low = int(wall.replace(tzinfo=tz, fold=1).astimezone(UTC).timestamp())
    high = int(first.timestamp())
    before = datetime.fromtimestamp(low, tz).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).utcoffset() == before:
            low = middle
        else:
            high = middle
    return datetime.fromtimestamp(high, UTC)


def _walk_start(now: datetime, tz: ZoneInfo) -> datetime:
    """A naive wall-clock time after every slot whose instant is at or before ``now``."""
    local = now.astimezone(tz)
    wall = local.replace(tzinfo=None, microsecond=0) + timedelta(seconds=1)
    if local.fold == 1:  # inside a repeated hour's second pass: its slots already fired
        offsets = (local.replace(fold=0).utcoffset(), local.utcoffset())
        if offsets[0] is not None and offsets[1] is not None:
            wall += offsets[0] - offsets[1]
    return wall


def slots_back(expression: str, tz: ZoneInfo, now: datetime) -> Iterator[datetime]:
    """The schedule's slot instants at or before ``now``, latest first, without repeats."""
    walker = croniter(expression, _walk_start(now, tz), second_at_beginning=True)
    previous: datetime | None = None
    while True:
        at = instant(walker.get_prev(datetime), tz)
        if at > now or at == previous:
            continue
        previous = at
        yield at


def due(
    expression: str,
    tz: ZoneInfo,
    *,
    now: datetime,
    after: datetime,
    catchup_seconds: float = 0.0,
) -> tuple[list[datetime], int]:
    """The slots to fire at ``now`` (oldest first) for a schedule that has handled every slot
    up to ``after``, and how many later slots it misses (not fired).

    Catch-up policy: with ``catchup_seconds`` 0 only the latest slot in (after, now] fires;
    otherwise every slot no older than ``now - catchup_seconds`` fires, at most
    :data:`MAX_SLOTS_WALKED`, and the older ones are missed. Missed slots are counted up to
    :data:`MAX_SLOTS_WALKED`."""
    window = now - timedelta(seconds=catchup_seconds) if catchup_seconds else None
    fire: list[datetime] = []
    missed = 0
    for walked, at in enumerate(slots_back(expression, tz, now)):
        if at <= after or walked >= MAX_SLOTS_WALKED:
            break
        if not fire or (window is not None and at >= window):
            fire.append(at)
        else:
            missed += 1
    fire.reverse()
    return fire, missed


def next_slot(expression: str, tz: ZoneInfo, now: datetime) -> datetime:
    """The first slot instant after ``now``."""
    # Wall-clock time only moves back in a repeated hour, where slots at or before now (the
    # first pass's) are skipped by the comparison.
    start = now.astimezone(tz).replace(tzinfo=None, microsecond=0)
    walker = croniter(expression, start, second_at_beginning=True)
    while True:
        at = instant(walker.get_next(datetime), tz)
        if at > now:
            return at
