"""The operator-facing CLI commands: status, jobs, retry, cancel, prune, enqueue.

Each takes parsed arguments, talks to PostgreSQL through :class:`leaseq.Queue`, prints a
table (or JSON with ``--json``) and returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from leaseq import config as settings
from leaseq.cli import limits, pipelines, queues, schedules, steps
from leaseq.cli.args import connect_for, days, duration, json_argument, say, seconds
from leaseq.cli.tables import (
    age,
    cancelled_counts,
    key_values,
    printable,
    table,
    to_json,
    when,
)
from leaseq.core.flow import FlowControl
from leaseq.core.history import EVERY_QUEUE, History
from leaseq.core.models import (
    FINISHED_STATUSES,
    After,
    AttemptOutcome,
    AttemptRecord,
    JobLinks,
    JobPlace,
    JobStatus,
    JobWhereabouts,
    QueueFinished,
    QueueStats,
    SignalRecord,
    UnservedWork,
    WaitingOn,
    WorkerRecord,
)
from leaseq.core.queue import Queue
from leaseq.core.workers import Workers

#: `status` counts succeeded and cancelled jobs over this window (seconds), not all history.
FINISHED_WINDOW = 3600.0
#: Flow-control keys and blocked aggregates `leaseq status` lists at most (saturated first).
STATUS_KEYS = 20


def status(args: argparse.Namespace) -> int:
    """Depth per queue and the registered workers; ``--watch`` refreshes until Ctrl-C."""
    with connect_for(args, "status") as conn:
        queue, registry, flow = Queue(conn), Workers(conn), FlowControl(conn)
        try:
            while True:
                stats = queue.stats(args.queue or None)
                finished = queue.finished(args.queue or None, window=FINISHED_WINDOW)
                workers = registry.list(args.queue or None)
                unserved = queue.unserved(args.queue or None)
                waiting = queue.waiting(args.queue or None)
                signal_waits = {w.queue: w.waiting for w in queue.signal_waits(args.queue or None)}
                keys = flow.status(args.queue or None, limit=STATUS_KEYS)
                blocked = flow.blocked(args.queue or None, limit=STATUS_KEYS)
                uncertain = queue.uncertain_steps(limit=steps.SHOWN)
                if args.json:
                    shown = {
                        "queues": stats,
                        "finished_last_hour": finished,
                        "workers": workers,
                        "unserved": unserved,
                        "waiting": waiting,
                        "waiting_for_signals": signal_waits,
                        "keys": keys,
                        "blocked_aggregates": blocked,
                        "uncertain_steps": uncertain,
                    }
                    print(to_json(shown), flush=True)
                else:
                    if args.watch and sys.stdout.isatty():
                        print("\033[2J\033[H", end="")
                    text = _status_text(stats, finished, workers, unserved)
                    extra = "\n\n".join(
                        t
                        for t in (limits.flow_text(keys, blocked), steps.uncertain_text(uncertain))
                        if t
                    )
                    waits = _waiting_text(waiting) + _signal_waits_text(signal_waits)
                    print(text + waits + (f"\n\n{extra}" if extra else ""), flush=True)
                if not args.watch:
                    return 0
                time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


def _waiting_text(waiting: dict[str, int]) -> str:
    """Jobs waiting for their parents (pipelines), per queue ("" if none): not work yet."""
    if not waiting:
        return ""
    counts = ", ".join(f"{queue} {n}" for queue, n in sorted(waiting.items()))
    return f"\n\nwaiting for parent jobs (not claimable yet): {counts}"


def _signal_waits_text(waiting: dict[str, int]) -> str:
    """Jobs waiting for a signal (ctx.wait_for), per queue ("" if none): they hold nothing."""
    if not waiting:
        return ""
    counts = ", ".join(f"{queue} {n}" for queue, n in sorted(waiting.items()))
    return f"\n\nwaiting for a signal (holding no worker): {counts}"


def _unserved_text(unserved: list[UnservedWork]) -> str:
    """The warning that ready work waits for a worker that serves its type ("" if none)."""
    if not unserved:
        return ""
    rows = [[u.queue, u.job_type, u.ready, age(u.oldest_ready_age)] for u in unserved]
    return (
        "\n\nready jobs no live worker serves (their queue's workers lack the job type; "
        "deploy a worker that registers it):\n"
        + table(["QUEUE", "JOB TYPE", "READY", "OLDEST READY"], rows)
    )


def _status_text(
    stats: list[QueueStats],
    finished: list[QueueFinished],
    workers: list[WorkerRecord],
    unserved: list[UnservedWork],
) -> str:
    done = {f.queue: f for f in finished}
    depth = {s.queue: s for s in stats}
    names = sorted(depth.keys() | done.keys())
    if not names:
        queues = (
            "no unfinished or dead jobs in any queue, and none finished in the last hour"
            " (`leaseq jobs list` shows older ones)"
        )
    else:
        empty = QueueStats("", 0, 0, 0, 0, 0, 0, None, None)
        queues = table(
            [
                "QUEUE",
                "READY",
                "SCHEDULED",
                "RUNNING",
                "DEAD",
                "HELD",
                "SUCCEEDED 1H",
                "CANCELLED 1H",
                "OLDEST READY",
                "MAX HEARTBEAT",
            ],
            [
                [
                    name,
                    (s := depth.get(name, empty)).ready,
                    s.scheduled,
                    s.running,
                    s.dead,
                    s.held,
                    (f := done.get(name, QueueFinished(name, 0, 0))).succeeded,
                    f.cancelled,
                    age(s.oldest_ready_age),
                    age(s.max_heartbeat_age),
                ]
                for name in names
            ],
        )
    queues += _unserved_text(unserved)
    if not workers:
        return queues + "\n\nno workers registered"
    return (
        queues
        + "\n\n"
        + table(
            ["WORKER", "STATE", "QUEUES", "JOB TYPES", "RUNNING", "SLOTS", "HEARTBEAT", "POD"],
            [
                [
                    w.worker_id,
                    # What a dead worker's row last said is not what it is doing now.
                    f"silent (last {w.state})" if w.silent else w.state,
                    ",".join(w.queues),
                    "*" if w.job_types is None else ",".join(w.job_types),
                    w.running,
                    w.concurrency,
                    age(w.heartbeat_age) + " ago",
                    w.pod,
                ]
                for w in workers
            ],
        )
    )


def jobs_list(args: argparse.Namespace) -> int:
    with connect_for(args, "list jobs") as conn:
        records = Queue(conn).jobs(status=args.status, queue=args.queue, limit=args.limit)
    if args.json:
        print(to_json(records))
        return 0
    if not records:
        print("no jobs match")
        return 0
    print(
        table(
            ["ID", "QUEUE", "TYPE", "STATUS", "ATTEMPTS", "CREATED", "FINISHED", "LAST ERROR"],
            [
                [
                    r.id,
                    r.queue,
                    r.job_type,
                    r.status,
                    f"{r.attempt_count}/{r.max_attempts}",
                    when(r.created_at),
                    when(r.finished_at),
                    # A succeeded job keeps an earlier attempt's error; it is not its outcome.
                    "-" if r.status == JobStatus.SUCCEEDED else _short(r.last_error),
                ]
                for r in records
            ],
        )
    )
    return 0


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return "-"
    line = text.splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def _error_text(error: str | None, code: str | None) -> str:
    """The error with its code, the code only when the message does not already start with it
    (a handler's exception is stored as ``ValueError: boom`` with code ``ValueError``)."""
    if not error:
        return code or "-"
    if not code or error.startswith(code):
        return error
    return f"{error} [{code}]"


def _error_field(record: JobWhereabouts, attempts: list[AttemptRecord]) -> tuple[str, str]:
    """``last error`` for a job that has not succeeded; for a succeeded one the error of an
    earlier attempt, labelled as such, so it never reads as the job's outcome."""
    text = _error_text(record.last_error, record.last_error_code)
    if record.status != JobStatus.SUCCEEDED:
        return ("last error", text)
    if not record.last_error:
        return ("earlier error", "-")
    failed = [a.attempt for a in attempts if a.error and a.outcome != AttemptOutcome.SUCCEEDED]
    where = f"attempt {failed[-1]}" if failed else "an earlier attempt"
    return ("earlier error", f"{text} (in {where}; the job then succeeded)")


#: What the ledger does not keep (shown as absent rather than as empty values).
LEDGER_ABSENT = {
    "priority", "available", "started", "lease", "lease expires", "max runtime",
    "idempotency key", "payload", "progress", "result",
}  # fmt: skip
PLACES = {
    JobPlace.HOT: "leaseq.jobs (live or recently finished)",
    JobPlace.HISTORY: "leaseq.job_history (moved after it finished)",
    JobPlace.LEDGER: "leaseq.job_ledger only (its history was dropped by retention)",
}


def jobs_show(args: argparse.Namespace) -> int:
    with connect_for(args, "show job") as conn:
        record, found = History(conn).whereabouts(args.job_id)
        attempts = list(found)
        hot = record.place == JobPlace.HOT
        links = Queue(conn).links(args.job_id) if hot else None
        # Steps are deleted with their job when it leaves the hot table.
        job_steps = Queue(conn).steps(args.job_id) if hot else []
        # Signals go with their job too; only a pending job waits.
        waiting_on = Queue(conn).waiting_on(args.job_id) if hot else None
        signals = Queue(conn).signals(args.job_id) if hot else []
    if args.json:
        shown = {"job": record, "attempts": attempts, "links": links, "steps": job_steps,
                 "waiting_on": waiting_on, "signals": signals}  # fmt: skip
        print(to_json(shown))
        return 0
    of = f"{record.attempt_count} of {record.max_attempts}" if record.max_attempts else None
    fields = [
        ("id", record.id),
        ("found in", PLACES[record.place]),
        ("queue", record.queue),
        ("type", record.job_type),
        ("status", record.status),
        *_waiting_fields(waiting_on),
        ("attempts", of or record.attempt_count),
        ("priority", "-" if record.priority is None else record.priority),
        ("created", when(record.created_at)),
        ("available", when(record.available_at)),
        ("started", when(record.started_at)),
        ("finished", when(record.finished_at)),
        ("lease", f"{record.lease_owner or '-'} token {record.lease_token}"),
        ("lease expires", when(record.lease_expires_at)),
        ("max runtime", age(record.timeout_seconds)),
        # Without a key given at enqueue, no effect row is written (job_complete): handlers
        # still see job:<id> as ctx.effect_key, and the result stays in the job's row.
        ("idempotency key", record.idempotency_key or f"- (ctx.effect_key job:{record.id})"),
        _error_field(record, attempts),
        ("payload", json.dumps(record.payload)),
        ("progress", json.dumps(record.progress)),
        ("result", json.dumps(record.result)),
    ]
    if record.place == JobPlace.LEDGER:
        fields = [f for f in fields if f[0] not in LEDGER_ABSENT]
    print(key_values(fields))
    if links is not None and (links.parents or links.children or links.pipeline_id):
        print()
        print(_links_text(links))
    if job_steps:
        print()
        print(steps.steps_text(job_steps))
    if signals:
        print()
        print(_signals_text(signals))
    print()
    if not attempts:
        kept = " (the ledger keeps no attempts)" if record.place == JobPlace.LEDGER else ""
        print(f"no attempts recorded{kept}")
        return 0
    print(
        table(
            ["ATTEMPT", "TOKEN", "WORKER", "STARTED", "ENDED", "OUTCOME", "ERROR"],
            [
                [
                    a.attempt,
                    a.lease_token,
                    a.worker,
                    when(a.started_at),
                    when(a.ended_at),
                    a.outcome,
                    _short(a.error),
                ]
                for a in attempts
            ],
        )
    )
    for a in attempts:
        if a.traceback:
            print(f"\ntraceback of attempt {a.attempt} (token {a.lease_token}, {a.outcome}):")
            print("\n".join("  " + printable(line) for line in a.traceback.splitlines()))
    return 0


def _waiting_fields(on: WaitingOn | None) -> list[tuple[str, Any]]:
    """What a pending job waits for (ctx.wait_for), since when and until when; none if not."""
    if on is None:
        return []
    return [
        ("waiting for", f"signal {printable(on.waiting_for)!r}"),
        ("waiting since", when(on.waiting_since)),
        ("wait deadline", when(on.deadline)),
    ]


def _signals_text(signals: list[SignalRecord]) -> str:
    """The signals sent to a job (not their payloads: only their sizes)."""
    rows = [[printable(s.name), when(s.sent_at), printable(s.sent_by), s.bytes] for s in signals]
    return "signals:\n" + table(["NAME", "SENT", "BY", "BYTES"], rows)


def _links_text(links: JobLinks) -> str:
    """A job's pipeline, parents and children (the first of each)."""
    lines = [
        key_values(
            [
                ("pipeline", links.pipeline_id or "-"),
                ("parents left", links.deps_left),
                (
                    "cancelled by",
                    f"job {links.cancelled_by} (its retry brings this back)"
                    if links.cancelled_by
                    else "-",
                ),
            ]
        )
    ]
    for title, linked, more in (
        ("PARENT", links.parents, links.more_parents),
        ("CHILD", links.children, links.more_children),
    ):
        if linked:
            rows = [[j.job_id, j.job_type, j.status, j.after] for j in linked]
            if more:
                rows.append(["...", "", "", ""])
            lines.append(table([title, "TYPE", "STATUS", "AFTER"], rows))
    return "\n\n".join(lines)


def retry(args: argparse.Namespace) -> int:
    with connect_for(args, "retry") as conn:
        new_max = Queue(conn).retry_dead(args.job_id, attempts=args.attempts)
    say(
        args,
        {"job_id": args.job_id, "status": "pending", "max_attempts": new_max},
        f"job {args.job_id} is pending again (max attempts now {new_max})",
    )
    return 0


def cancel(args: argparse.Namespace) -> int:
    with connect_for(args, "cancel") as conn:
        result = Queue(conn).cancel(args.job_id, reason=args.reason)
    # The counts are of every job the cancel reached: the job itself (when it was
    # unfinished) and its unfinished descendants.
    counts = cancelled_counts(result.pending, result.running)
    if result.cancelled:
        text = (
            f"{1 + result.descendants} job(s) cancelled: job {args.job_id} (was"
            f" {result.previous_status}) and {result.descendants} unfinished descendant(s);"
            f" {counts}"
        )
    elif result.descendants:
        text = (
            f"job {args.job_id} was already {result.previous_status}; its"
            f" {result.descendants} unfinished descendant(s) cancelled; {counts}"
        )
    else:
        text = f"job {args.job_id} was already {result.previous_status}; nothing changed"
    say(args, result, text)
    return 0 if result.cancelled or result.descendants else 1


def signal(args: argparse.Namespace) -> int:
    with connect_for(args, "signal") as conn:
        queue = Queue(conn)
        waiting = queue.waiting_on(args.job_id)
        if waiting is not None and waiting.waiting_for != args.name and not args.ahead:
            # Most likely a misspelt name: a signal is kept for good, and one the job never
            # waits for would leave the wait unanswered until its deadline.
            print(
                f"leaseq: error: job {args.job_id} waits for signal {waiting.waiting_for!r},"
                f" not {args.name!r}: nothing sent (to send {args.name!r} for a later wait of"
                " the job, add --ahead)",
                file=sys.stderr,
            )
            return 1
        sent = queue.signal(args.job_id, args.name, args.payload)
    if not sent.stored:
        text = (
            f"job {args.job_id} already has a signal {args.name!r}: the first is kept, this one"
            " was not stored"
        )
    elif sent.waiting:
        text = f"signal {args.name!r} sent to job {args.job_id}, which waited for it: it runs next"
    else:
        text = (
            f"signal {args.name!r} sent to job {args.job_id} (not waiting for it yet: its"
            " ctx.wait_for will find it)"
        )
    say(args, sent, text)
    return 0 if sent.stored else 1


def prune(args: argparse.Namespace) -> int:
    statuses = args.status or [str(s) for s in FINISHED_STATUSES]
    if JobStatus.DEAD in statuses and not args.include_dead:
        if args.status:
            print(
                "leaseq: error: refusing to delete dead jobs: they are the ones left to look "
                "at; add --include-dead to delete them too",
                file=sys.stderr,
            )
            return 2
        statuses = [s for s in statuses if s != JobStatus.DEAD]
    with connect_for(args, "prune") as conn:
        queue = Queue(conn)
        if args.dry_run:
            found = queue.prune_preview(older_than=args.older_than, statuses=statuses)
            total = sum(c.jobs for c in found)
            lines = [
                f"  {c.status}: {c.jobs} (finished {when(c.oldest)} .. {when(c.newest)})"
                for c in found
            ]
            kept = "" if JobStatus.DEAD in statuses else " (dead jobs kept: --include-dead)"
            head = f"dry run: would delete {total} finished job(s) and their attempts{kept}"
            text = "\n".join([head, *lines])
            say(args, {"dry_run": True, "would_delete": found}, text)
            return 0
        deleted = queue.prune(older_than=args.older_than, statuses=statuses)
    kept = "" if JobStatus.DEAD in statuses else " (dead jobs kept: --include-dead)"
    say(args, {"deleted": deleted}, f"deleted {deleted} finished job(s) and their attempts{kept}")
    return 0


def retention(args: argparse.Namespace) -> int:
    with connect_for(args, "retention") as conn:
        history = History(conn)
        if args.ledger is not None:
            history.set_ledger_retention(args.ledger)
        if args.unset:
            history.unset_retention(args.unset, queue=args.queue)
        for status, keep in (
            (JobStatus.SUCCEEDED, args.succeeded),
            (JobStatus.CANCELLED, args.cancelled),
            (JobStatus.DEAD, args.dead),
        ):
            if keep is not None:
                history.set_retention(status, keep, queue=args.queue)
        rules = history.retention()
    if args.json:
        print(to_json(rules))
        return 0
    ledger = rules[0].ledger_keep_days if rules else "-"
    print(
        table(
            ["QUEUE", "STATUS", "DAYS IN HISTORY"],
            [[r.queue, r.status, r.keep_days] for r in rules],
        )
    )
    print(f"\nledger rows kept {ledger} days after their job finished")
    return 0


def history_counts(args: argparse.Namespace) -> int:
    with connect_for(args, "count history") as conn:
        found = History(conn).counts(since=args.since, queue=args.queue)
    if args.json:
        print(to_json(found))
        return 0
    print(table(["QUEUE", "STATUS", "JOBS"], [[c.queue, c.status, c.jobs] for c in found]))
    return 0


def enqueue(args: argparse.Namespace) -> int:
    with connect_for(args, "enqueue") as conn:
        result = Queue(conn).enqueue(
            args.queue,
            args.job_type,
            args.payload,
            priority=args.priority,
            delay=args.delay,
            max_attempts=args.max_attempts,
            timeout=args.timeout,
            idempotency_key=args.idempotency_key,
            dedup_key=args.dedup_key,
            after=args.after,
            when=After.FINISHED if args.after_finished else After.SUCCEEDED,
            key=args.key,
            ordering_key=args.ordering_key,
        )
    text = (
        f"enqueued job {result.job_id}"
        if result.created
        else f"job {result.job_id} with that dedup key is already queued"
    )
    say(args, result, text)
    return 0


def add_commands(sub: Any) -> None:
    """Add status, jobs, retry, cancel, prune, enqueue and schedules to the ``leaseq``
    subparsers."""

    def command(name: str, help: str, func: Any, parent: Any = sub) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
        settings.add_options(parser, [settings.DATABASE_URL])
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
        parser.set_defaults(func=func)
        return parser

    p = command("status", "queue depth per queue and the registered workers", status)
    p.add_argument("--queue", action="append", help="only this queue (repeatable)")
    p.add_argument(
        "--watch",
        type=seconds,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )

    jobs = sub.add_parser(
        "jobs", help="list or inspect jobs", description="List jobs, or show one with its attempts."
    ).add_subparsers(dest="jobs_command", required=True)
    p = command("list", "list jobs, newest first", jobs_list, jobs)
    p.add_argument("--status", choices=[str(s) for s in JobStatus])
    p.add_argument("--queue")
    p.add_argument("--limit", type=int, default=50)
    p = command("show", "one job with its attempts (the audit trail)", jobs_show, jobs)
    p.add_argument("job_id", type=int)

    p = command("retry", "put a dead job back to pending (same id and history)", retry)
    p.add_argument("job_id", type=int)
    p.add_argument("--attempts", type=int, help="attempts to grant (default: its original budget)")

    p = command(
        "cancel",
        "cancel a waiting, pending or running job with its unfinished descendants",
        cancel,
    )
    p.add_argument("job_id", type=int)
    p.add_argument("--reason")

    p = command("signal", "send a signal to a job (for its handler's ctx.wait_for)", signal)
    p.add_argument("job_id", type=int)
    p.add_argument("name", help="the signal's name (what the handler waits for)")
    p.add_argument(
        "--payload",
        type=json_argument,
        default=None,
        metavar="JSON",
        help="the signal's payload, JSON (default null; at most 64 KiB)",
    )
    p.add_argument(
        "--ahead",
        action="store_true",
        help="send it even though the job waits for another signal now (for a later wait of"
        " the job); without it such a signal is refused, naming the one the job waits for",
    )

    p = command(
        "prune",
        "delete finished jobs older than a retention from the hot table (dead ones only with "
        "--include-dead)",
        prune,
    )
    p.add_argument(
        "--older-than",
        type=duration,
        required=True,
        help="e.g. 90s, 30min, 12h, 7d, 2w (a bare number is seconds; 'm' is refused)",
    )
    p.add_argument("--status", action="append", choices=[str(s) for s in FINISHED_STATUSES])
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be deleted, delete nothing"
    )
    p.add_argument("--include-dead", action="store_true", help="delete dead jobs too")

    p = command(
        "retention",
        "show or change how long moved jobs stay in history, per queue and final state",
        retention,
    )
    p.add_argument(
        "--queue", default=EVERY_QUEUE, help="the queue a rule is for (default '*': every queue)"
    )
    for state in ("succeeded", "cancelled", "dead"):
        p.add_argument(
            f"--{state}", type=days, metavar="DAYS", help=f"days {state} jobs stay, e.g. 7d"
        )
    p.add_argument(
        "--unset",
        choices=[str(s) for s in FINISHED_STATUSES],
        help="remove --queue's own rule for this state",
    )
    p.add_argument(
        "--ledger", type=days, metavar="DAYS", help="days ledger rows stay (>= every rule)"
    )

    history = sub.add_parser(
        "history", help="finished-job counts from the rollup", description="Read the history."
    ).add_subparsers(dest="history_command", required=True)
    p = command(
        "counts",
        "finished jobs per queue and final state (never counts history rows)",
        history_counts,
        history,
    )
    p.add_argument("--since", type=duration, default=86400.0, help="how far back (default 1d)")
    p.add_argument("--queue")

    p = command("enqueue", "enqueue one job", enqueue)
    p.add_argument("queue")
    p.add_argument("job_type")
    p.add_argument("--payload", type=json_argument, default={}, help="JSON payload")
    p.add_argument("--priority", type=int, default=100, help="lower runs first (default 100)")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before it may run")
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--timeout", type=float, help="max runtime of one attempt, seconds")
    p.add_argument("--idempotency-key", help="effect key derived from the work")
    p.add_argument("--dedup-key", help="refuse a second unfinished job with this key")
    p.add_argument(
        "--after",
        type=int,
        action="append",
        metavar="JOB_ID",
        help="wait for this job to succeed first (repeatable): the job is waiting until then",
    )
    p.add_argument(
        "--after-finished",
        action="store_true",
        help="with --after: wait for the parents to finish in any state, not to succeed",
    )

    p.add_argument("--key", help="flow-control key (e.g. a tenant): its queue's limits apply")
    p.add_argument("--ordering-key", help="run one at a time, in enqueue order, with this key")

    schedules.add_commands(sub, command)
    pipelines.add_commands(sub, command)
    limits.add_commands(sub, command)
    queues.add_commands(sub, command)
    steps.add_commands(sub, command)
