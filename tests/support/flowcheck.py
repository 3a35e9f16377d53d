"""What the flow-control tests compute from the attempt history: how many jobs of one key
ran at once, from leaseq.job_attempts' intervals."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import psycopg

# An attempt's interval ends at its ended_at. A reaped attempt's row is rewritten `fenced`
# with the time its stale worker called in, but its lease (what a limit counts) ended at the
# reap: the caller passes those reap times (``reaped``); and in any case it ended before the
# job could be claimed again.
_INTERVALS = """
SELECT j.key, a.job_id, a.lease_token, a.started_at,
       least(a.ended_at, lead(a.started_at) OVER (PARTITION BY a.job_id ORDER BY a.lease_token))
  FROM leaseq.job_attempts a JOIN leaseq.jobs j ON j.id = a.job_id
 WHERE j.queue = %(queue)s AND j.key IS NOT NULL AND a.started_at IS NOT NULL
"""

_RUNNING = """
SELECT j.key, j.started_at FROM leaseq.jobs j
 WHERE j.queue = %(queue)s AND j.key IS NOT NULL AND j.status = 'running'
"""


def intervals(
    conn: psycopg.Connection[tuple[object, ...]],
    queue: str,
    reaped: dict[tuple[int, int], datetime] | None = None,
) -> dict[str, list[tuple[datetime, datetime | None]]]:
    """Per key, every attempt's (start, end); end None for attempts still running."""
    found: dict[str, list[tuple[datetime, datetime | None]]] = defaultdict(list)
    reaped = reaped or {}
    for key, job, token, start, end in conn.execute(_INTERVALS, {"queue": queue}).fetchall():
        at = reaped.get((int(job), int(token)))  # type: ignore[call-overload]
        if at is not None and end is not None:
            end = min(end, at)  # type: ignore[type-var]
        found[str(key)].append((start, end))  # type: ignore[arg-type]
    for key, start in conn.execute(_RUNNING, {"queue": queue}).fetchall():
        found[str(key)].append((start, None))  # type: ignore[arg-type]
    return found


def max_running(
    spans: list[tuple[datetime, datetime | None]], after: datetime | None = None
) -> int:
    """The most intervals open at once (an end at the same instant as a start comes first).
    With ``after``: the most open at any start later than it (what a lowered limit bounds:
    attempts already running drain, no new one starts past the limit)."""
    events: list[tuple[datetime, int]] = []
    for start, end in spans:
        events.append((start, 1))
        if end is not None:
            events.append((end, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    open_now = best = 0
    for at, step in events:
        open_now += step
        if step > 0 and (after is None or at > after):
            best = max(best, open_now)
    return best
