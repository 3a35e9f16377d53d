"""`leaseq enqueue --key/--ordering-key`, `leaseq limits ...` and the flow part of
`leaseq status`, against a real database."""

from __future__ import annotations

import json

import pytest

import leaseq
from leaseq.cli.main import main
from leaseq.core.models import SILENT_AFTER_SECONDS


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_limits_commands_and_status(
    database_url: str, conn: leaseq.core.db.Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    code, out, _ = run(capsys, "limits", "set", "ocr", "tenant-*", "--max-running", "1", *db)
    assert (code, out) == (0, "ocr tenant-*: at most 1 running, weight 1 (applied to 0 key(s))\n")
    for _ in range(2):
        assert run(capsys, "enqueue", "ocr", "extract", "--key", "tenant-42", *db)[0] == 0
    assert run(capsys, "enqueue", "ocr", "extract", "--ordering-key", "order-17", *db)[0] == 0
    [limit] = json.loads(run(capsys, "limits", "list", "--json", *db)[1])
    assert (limit["key_pattern"], limit["max_running"]) == ("tenant-*", 1)
    q = leaseq.Queue(conn)
    got = q.claim(["ocr"], "w", limit=10)
    assert len(got) == 2  # one of tenant-42 (its limit), the aggregate's head
    code, out, _ = run(capsys, "status", *db)
    assert code == 0
    assert "tenant-42" in out and "yes" in out, out  # saturated
    shown = json.loads(run(capsys, "limits", "keys", "--json", *db)[1])
    [key] = shown["keys"]
    assert (key["key"], key["saturated"], key["ready"], key["claimable"]) == (
        "tenant-42",
        True,
        1,
        0,
    )
    head = next(j for j in got if j.id == 3)
    q.fail(head.lease, "poison", retryable=False)
    code, out, _ = run(capsys, "limits", "keys", *db)
    assert "blocked by a dead head" in out and "order-17" in out
    assert (
        run(capsys, "limits", "unblock", "ocr", "order-17", *db)[1]
        == "ocr order-17: nothing left to run\n"
    )
    code, out, _ = run(capsys, "limits", "set", "ocr", "tenant-*", "--max-running", "2", *db)
    assert out.endswith("(applied to 1 key(s))\n")
    assert len(q.claim(["ocr"], "w", limit=10)) == 1
    assert run(capsys, "limits", "remove", "ocr", "tenant-*", *db)[0] == 0
    assert run(capsys, "limits", "list", *db)[1] == "no limits\n"


def test_limits_keys_counts_units_held_by_silent_workers(
    database_url: str, conn: leaseq.core.db.Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key's units held by a worker past the silence rule (or not registered) are counted;
    a live worker's are not."""
    db = ["--database-url", database_url]
    flow = leaseq.FlowControl(conn)
    flow.set_limit("held", "tenant-a", max_running=3)
    q = leaseq.Queue(conn)
    for _ in range(4):
        q.enqueue("held", "t", key="tenant-a")
    for owner in ("w-live", "w-crashed", "w-unregistered"):
        assert len(q.claim(["held"], owner, lease_seconds=30)) == 1
    conn.execute(
        "INSERT INTO leaseq.workers (worker_id, queues, concurrency, heartbeat_at)"
        " VALUES ('w-live', '{held}', 1, now()),"
        " ('w-crashed', '{held}', 1, now() - make_interval(secs => %s))",
        (SILENT_AFTER_SECONDS + 30,),
    )
    shown = json.loads(run(capsys, "limits", "keys", "held", "--json", *db)[1])
    [key] = shown["keys"]
    assert (key["running"], key["held_silent"]) == (3, 2)
    out = run(capsys, "limits", "keys", "held", *db)[1]
    header, row = out.splitlines()[:2]
    assert "HELD BY SILENT" in header
    column = header.index("HELD BY SILENT")
    assert row[column:].split()[0] == "2", out


def test_rate_limit_flags(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--database-url", database_url]
    code, out, _ = run(capsys, "limits", "set", "api", "openai", "--per-second", "10",
                       "--burst", "20", *db)  # fmt: skip
    assert (code, out) == (
        0, "api openai: no limit, 10 starts/s (burst 20), weight 1 (applied to 0 key(s))\n"
    )  # fmt: skip
    [limit] = json.loads(run(capsys, "limits", "list", "--json", *db)[1])
    assert (limit["per_second"], limit["burst"]) == (10, 20)
    assert "10/s burst 20" in run(capsys, "limits", "list", *db)[1]


def test_limits_set_changes_only_the_flags_given(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A missing flag keeps what is set: `set` without --max-running once replaced a
    # tenant's limit of 2 with no limit at all.
    db = ["--database-url", database_url]

    def limit() -> tuple[object, ...]:
        [got] = json.loads(run(capsys, "limits", "list", "--json", *db)[1])
        return (got["max_running"], got["weight"], got["per_second"], got["burst"])

    assert run(capsys, "limits", "set", "ocr", "tenant-a", "--max-running", "2", *db)[0] == 0
    code, out, _ = run(capsys, "limits", "set", "ocr", "tenant-a", "--weight", "3", *db)
    assert (code, out) == (0, "ocr tenant-a: at most 2 running, weight 3 (applied to 0 key(s))\n")
    assert limit() == (2, 3, None, None)
    run(capsys, "limits", "set", "ocr", "tenant-a", "--per-second", "5", *db)
    assert limit() == (2, 3, 5, 1)
    run(capsys, "limits", "set", "ocr", "tenant-a", "--burst", "4", *db)
    assert limit() == (2, 3, 5, 4)
    # Removing one part is said explicitly; the others stay.
    code, out, _ = run(capsys, "limits", "set", "ocr", "tenant-a", "--max-running", "none", *db)
    assert out == "ocr tenant-a: no limit, 5 starts/s (burst 4), weight 3 (applied to 0 key(s))\n"
    assert limit() == (None, 3, 5, 4)
    run(capsys, "limits", "set", "ocr", "tenant-a", "--per-second", "none", *db)
    assert limit() == (None, 3, None, None)
    # --burst needs a rate, given or already set.
    code, _, err = run(capsys, "limits", "set", "ocr", "tenant-a", "--burst", "2", *db)
    assert code != 0 and "burst" in err
