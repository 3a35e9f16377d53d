"""`leaseq schedules add/list/pause/resume/remove` against a real database."""

from __future__ import annotations

import json

import pytest

import leaseq
from leaseq.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_add_list_pause_resume_remove(
    database_url: str, conn: leaseq.core.db.Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    code, out, _ = run(capsys, "schedules", "add", "nightly", "30 2 * * *", "--queue", "batch",
                       "--job-type", "reindex", "--timezone", "Europe/Berlin",
                       "--payload", '{"full": true}', "--catchup", "6h", *db)  # fmt: skip
    assert (code, out) == (0, "schedule nightly added\n")
    record = leaseq.Schedules(conn).get("nightly")
    assert (record.payload, record.catchup_seconds, record.timezone) == (
        {"full": True}, 21600.0, "Europe/Berlin"
    )  # fmt: skip
    code, out, _ = run(capsys, "schedules", "list", *db)
    header, line = out.splitlines()
    assert header.split()[:4] == ["NAME", "STATE", "CRON", "TIMEZONE"]
    assert line.split()[:2] == ["nightly", "active"]
    code, out, _ = run(capsys, "schedules", "pause", "nightly", *db)
    assert out == "schedule nightly paused\n"
    [listed] = json.loads(run(capsys, "schedules", "list", "--json", *db)[1])
    assert (listed["state"], listed["next_slot"] is not None) == ("paused", True)
    assert run(capsys, "schedules", "resume", "nightly", *db)[0] == 0
    assert leaseq.Schedules(conn).get("nightly").state is leaseq.ScheduleState.ACTIVE
    assert run(capsys, "schedules", "remove", "nightly", *db)[:2] == (
        0,
        "schedule nightly removed\n",
    )
    code, _, err = run(capsys, "schedules", "remove", "nightly", *db)
    assert (code, err) == (2, "leaseq: error: no schedule named 'nightly'\n")


@pytest.mark.parametrize(
    ("cron", "zone", "says"),
    [
        ("0 3 * *", "UTC", "invalid cron: '0 3 * *' has 4 fields"),
        ("0 3 * * *", "Berlin", "invalid timezone: 'Berlin' is not an IANA time zone name"),
    ],
)
def test_a_bad_cron_or_zone_is_named(
    database_url: str, capsys: pytest.CaptureFixture[str], cron: str, zone: str, says: str
) -> None:
    code, _, err = run(capsys, "schedules", "add", "x", cron, "--queue", "q", "--job-type", "t",
                       "--timezone", zone, "--database-url", database_url)  # fmt: skip
    assert code == 2
    assert err.startswith(f"leaseq: error: {says}")


def test_a_schedule_that_would_skip_slots_is_refused_with_the_reason(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fine = ["schedules", "add", "fine", "*/2 * * * * *", "--queue", "q", "--job-type", "t"]
    code, _, err = run(capsys, *fine, "--catchup", "0", "--database-url", database_url)
    assert code == 2
    assert "slots 2 s apart" in err and "--catchup" in err, err
    code, _, _ = run(capsys, *fine, "--database-url", database_url)
    assert code == 0  # the default catch-up fires every slot
