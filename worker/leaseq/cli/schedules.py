"""``leaseq schedules add/list/pause/resume/remove``: run-time schedules through
:class:`leaseq.Schedules` (the same calls as in Python)."""

from __future__ import annotations

import argparse
from typing import Any

from leaseq.cli.commands import _connect, _say, duration, json_argument
from leaseq.cli.tables import age, table, to_json, when
from leaseq.core.cron import DEFAULT_CATCHUP_SECONDS
from leaseq.core.schedule_models import Overlap, ScheduleRecord, ScheduleSpec
from leaseq.core.schedules import Schedules


def _row(record: ScheduleRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "state": record.state,
        "cron": record.cron,
        "timezone": record.timezone,
        "queue": record.queue,
        "job_type": record.job_type,
        "declared_by": record.declared_by,
        "declared_in": record.declared_in,
        "disabled_reason": record.disabled_reason,
        "overlap": record.overlap,
        "last_slot": record.last_slot,
        "next_slot": record.next_slot,
        "lag_seconds": record.lag_seconds,
        "missed_slots": record.missed_slots,
        "last_job_id": record.last_job_id,
        "last_job_status": record.last_job_status,
    }


def list_schedules(args: argparse.Namespace) -> int:
    with _connect(args, "list schedules") as conn:
        records = Schedules(conn).list(args.name)
    if args.json:
        print(to_json([_row(r) for r in records]))
        return 0
    headers = ["NAME", "STATE", "CRON", "TIMEZONE", "QUEUE", "JOB TYPE", "BY", "LAST SLOT",
               "NEXT SLOT", "LAG", "MISSED", "LAST JOB"]  # fmt: skip
    rows = [
        [
            r.name,
            r.state if r.disabled_reason is None else f"{r.state} ({r.disabled_reason})",
            r.cron,
            r.timezone,
            r.queue,
            r.job_type,
            r.declared_by if r.declared_in is None else f"{r.declared_by} {r.declared_in}",
            when(r.last_slot),
            when(r.next_slot),
            age(r.lag_seconds),
            r.missed_slots,
            "-" if r.last_job_id is None else f"{r.last_job_id} {r.last_job_status or 'gone'}",
        ]
        for r in records
    ]
    print(table(headers, rows) if rows else "no schedules")
    return 0


def add(args: argparse.Namespace) -> int:
    spec = ScheduleSpec(
        args.name,
        args.cron,
        args.queue,
        args.job_type,
        args.payload,
        args.timezone,
        args.priority,
        args.max_attempts,
        Overlap(args.overlap),
        args.catchup,
    )
    with _connect(args, "add schedule") as conn:
        created = Schedules(conn).add(spec)
    verb = "added" if created else "updated"
    _say(args, {"name": args.name, "created": created}, f"schedule {args.name} {verb}")
    return 0


def pause(args: argparse.Namespace) -> int:
    with _connect(args, "pause schedule") as conn:
        Schedules(conn).pause(args.name)
    _say(args, {"name": args.name, "paused": True}, f"schedule {args.name} paused")
    return 0


def resume(args: argparse.Namespace) -> int:
    with _connect(args, "resume schedule") as conn:
        Schedules(conn).resume(args.name)
    text = f"schedule {args.name} resumed (from its next slot)"
    _say(args, {"name": args.name, "paused": False}, text)
    return 0


def remove(args: argparse.Namespace) -> int:
    with _connect(args, "remove schedule") as conn:
        Schedules(conn).remove(args.name)
    _say(args, {"name": args.name, "removed": True}, f"schedule {args.name} removed")
    return 0


def add_commands(sub: Any, command: Any) -> None:
    """Add ``schedules`` and its subcommands to the ``leaseq`` subparsers (``command`` makes
    one subcommand with the database and ``--json`` options)."""
    group = sub.add_parser(
        "schedules",
        help="periodic jobs: add, list, pause, resume, remove",
        description="Run-time schedules (those declared in code are listed too). An edit is "
        "seen by the next scheduler tick.",
    ).add_subparsers(dest="schedules_command", required=True)
    p = command("list", "schedules with last and next slot, lag, missed slots", list_schedules,
                group)  # fmt: skip
    p.add_argument("name", nargs="?", help="only this schedule")
    p = command("add", "add a schedule, or update the run-time schedule of that name", add, group)
    p.add_argument("name")
    p.add_argument("cron", help="5 fields, or 6 with leading seconds: '0 3 * * *'")
    p.add_argument("--queue", required=True)
    p.add_argument("--job-type", required=True)
    p.add_argument("--payload", type=json_argument, default={}, help="JSON payload")
    p.add_argument("--timezone", default="UTC", help="IANA zone of the wall clock (default UTC)")
    p.add_argument("--priority", type=int, default=100, help="lower runs first (default 100)")
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument(
        "--overlap",
        choices=[str(o) for o in Overlap],
        default=str(Overlap.SKIP),
        help="skip (default): no new job while the last one is pending or running",
    )
    p.add_argument(
        "--catchup",
        type=duration,
        default=DEFAULT_CATCHUP_SECONDS,
        help="fire every slot this recent (e.g. 6h), of older ones the latest only; the "
        "default (60s) covers a leader takeover; 0: the latest only",
    )
    for name, func, text in (
        ("pause", pause, "stop firing a schedule"),
        ("resume", resume, "fire a paused schedule again from its next slot"),
        ("remove", remove, "delete a schedule (its fired slots stay recorded)"),
    ):
        p = command(name, text, func, group)
        p.add_argument("name")
