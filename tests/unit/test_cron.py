"""Wall-clock slots on a controlled clock: the 2026 EU, US and southern-hemisphere
daylight-saving changes, catch-up, and the parser's errors (leaseq.core.cron)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from leaseq.core import cron
from leaseq.core.errors import InvalidJob

BERLIN = cron.zone("Europe/Berlin")
NEW_YORK = cron.zone("America/New_York")
SYDNEY = cron.zone("Australia/Sydney")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def slots(expression: str, tz: object, start: datetime, end: datetime) -> list[datetime]:
    """Every slot in (start, end], oldest first (a catch-up window covering all of it)."""
    window = (end - start).total_seconds() + 1
    fired, missed = cron.due(expression, tz, now=end, after=start, catchup_seconds=window)  # type: ignore[arg-type]
    assert missed == 0
    return fired


def test_a_daily_slot_in_the_spring_forward_gap_fires_once_at_the_end_of_the_gap() -> None:
    # Berlin, 29 March 2026: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist.
    fired = slots("30 2 * * *", BERLIN, utc(2026, 3, 27, 12), utc(2026, 3, 30, 12))
    assert fired == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 29, 0, 30) + timedelta(days=1),
    ]


def test_slots_inside_and_at_the_end_of_the_gap_are_one_slot() -> None:
    fired = slots("*/30 * * * *", BERLIN, utc(2026, 3, 28, 23, 59), utc(2026, 3, 29, 2, 0))
    # 01:00 CET, 01:30 CET, then 02:00, 02:30 (missing) and 03:00 CEST all at 01:00 UTC.
    assert fired == [utc(2026, 3, 29, 0), utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1),
                     utc(2026, 3, 29, 1, 30), utc(2026, 3, 29, 2)]  # fmt: skip


def test_the_repeated_fall_back_hour_fires_once() -> None:
    # Berlin, 25 October 2026: 03:00 CEST falls back to 02:00 CET (01:00 UTC).
    hourly = slots("0 * * * *", BERLIN, utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 3))
    # 01:00 CEST, 02:00 CEST (first pass), 03:00 CET, 04:00 CET: no second 02:00.
    assert hourly == [utc(2026, 10, 24, 23), utc(2026, 10, 25, 0), utc(2026, 10, 25, 2),
                      utc(2026, 10, 25, 3)]  # fmt: skip
    daily = slots("30 2 * * *", BERLIN, utc(2026, 10, 24, 12), utc(2026, 10, 25, 12))
    assert daily == [utc(2026, 10, 25, 0, 30)]


def test_a_tick_during_the_second_pass_does_not_fire_the_repeated_slots_again() -> None:
    # 01:10 UTC is 02:10 CET, the second 02:10 of the night; 02:00 CEST fired at 00:00 UTC.
    fired, missed = cron.due(
        "0 * * * *", BERLIN, now=utc(2026, 10, 25, 1, 10), after=utc(2026, 10, 25, 0)
    )
    assert (fired, missed) == ([], 0)
    assert cron.next_slot("0 * * * *", BERLIN, utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 25, 2)


def test_a_tick_in_the_second_pass_after_downtime_fires_the_first_pass_last_slot() -> None:
    # Down since 23:55 UTC; at 01:10 UTC (02:10 CET, second pass) the latest slot is the
    # first pass's 02:50 CEST (00:50 UTC), not the wall-clock 02:10 that already passed.
    fired, missed = cron.due(
        "*/10 * * * *", BERLIN, now=utc(2026, 10, 25, 1, 10), after=utc(2026, 10, 24, 23, 55)
    )
    assert fired == [utc(2026, 10, 25, 0, 50)]
    assert missed == 5  # 00:00 .. 00:40 UTC


def test_new_york_2026_changes() -> None:
    # 8 March: 02:00 EST -> 03:00 EDT (07:00 UTC). 1 November: 02:00 EDT -> 01:00 EST (06:00 UTC).
    assert slots("30 2 * * *", NEW_YORK, utc(2026, 3, 8), utc(2026, 3, 8, 12)) == [
        utc(2026, 3, 8, 7)
    ]
    assert slots("30 1 * * *", NEW_YORK, utc(2026, 11, 1), utc(2026, 11, 1, 12)) == [
        utc(2026, 11, 1, 5, 30)
    ]


def test_sydney_2026_changes() -> None:
    # 5 April: 03:00 AEDT -> 02:00 AEST (16:00 UTC on the 4th); 4 October: 02:00 AEST -> 03:00 AEDT.
    ends = slots("30 2 * * *", SYDNEY, utc(2026, 4, 4, 6), utc(2026, 4, 5, 6))
    assert ends == [utc(2026, 4, 4, 15, 30)]
    starts = slots("30 2 * * *", SYDNEY, utc(2026, 10, 3, 6), utc(2026, 10, 4, 6))
    assert starts == [utc(2026, 10, 3, 16)]


def test_after_downtime_only_the_latest_slot_fires_and_the_rest_are_missed() -> None:
    fired, missed = cron.due("*/10 * * * * *", cron.zone("UTC"), now=utc(2026, 1, 1, 0, 1, 5),
                             after=utc(2026, 1, 1, 0, 0, 0))  # fmt: skip
    assert fired == [utc(2026, 1, 1, 0, 1, 0)]
    assert missed == 5  # 00:10 .. 00:50


def test_a_catch_up_window_backfills_oldest_first() -> None:
    fired, missed = cron.due("*/10 * * * * *", cron.zone("UTC"), now=utc(2026, 1, 1, 0, 1, 5),
                             after=utc(2026, 1, 1), catchup_seconds=30)  # fmt: skip
    assert fired == [utc(2026, 1, 1, 0, 0, 40), utc(2026, 1, 1, 0, 0, 50), utc(2026, 1, 1, 0, 1)]
    assert missed == 3


def test_nothing_is_due_before_the_next_slot() -> None:
    assert cron.due("0 3 * * *", BERLIN, now=utc(2026, 6, 1, 0), after=utc(2026, 5, 31, 1, 0)) == (
        [],
        0,
    )


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("61 * * * *", "'61 * * * *' is not a cron expression"),
        ("* * *", "has 3 fields"),
        ("0 0 30 2 *", "'0 0 30 2 *' is not a cron expression"),
        ("* * * * * * *", "has 7 fields"),
    ],
)
def test_a_bad_cron_is_named(expression: str, says: str) -> None:
    with pytest.raises(InvalidJob, match="invalid cron") as caught:
        cron.check_cron(expression)
    assert says in str(caught.value)


def test_a_bad_zone_is_named() -> None:
    with pytest.raises(InvalidJob, match="'Mars/Olympus' is not an IANA time zone name"):
        cron.zone("Mars/Olympus")


@pytest.mark.parametrize(
    ("expression", "gap"),
    [
        ("* * * * *", 60),  # five fields: a minute at least
        ("30 * * * * *", 60),  # one second a minute
        ("* * * * * *", 1),
        ("*/2 * * * * *", 2),
        ("*/5 * * * * *", 5),
        ("0,30 * * * * *", 30),
        ("0,58 * * * * *", 2),  # 58 then the next minute's 0
        ("0,58 */2 * * * *", 58),  # no next minute to wrap into
    ],
)
def test_the_shortest_gap_between_slots(expression: str, gap: int) -> None:
    assert cron.shortest_gap(expression) == gap
