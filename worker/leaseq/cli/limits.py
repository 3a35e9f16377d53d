"""``leaseq limits set/list/remove/keys/unblock``: flow control at run time through
:class:`leaseq.FlowControl` (the same calls as in Python)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from leaseq.cli.args import connect_for, say
from leaseq.cli.tables import table, to_json, when
from leaseq.core.flow import FlowControl


def set_limit(args: argparse.Namespace) -> int:
    given = {
        name: getattr(args, name)
        for name in ("max_running", "weight", "per_second", "burst")
        if hasattr(args, name)  # a flag not given is absent: that part of the limit stays
    }
    with connect_for(args, "set limit") as conn:
        flow = FlowControl(conn)
        keys = flow.update_limit(args.queue, args.key, **given)
        [lim] = (x for x in flow.limits(args.queue) if x.key_pattern == args.key)
    limit = "no limit" if lim.max_running is None else f"at most {lim.max_running} running"
    if lim.per_second is not None:
        limit += f", {lim.per_second:g} starts/s (burst {lim.burst or 1:g})"
    text = f"{args.queue} {args.key}: {limit}, weight {lim.weight:g} (applied to {keys} key(s))"
    say(args, {"queue": args.queue, "key": args.key, "keys": keys}, text)
    return 0


def remove_limit(args: argparse.Namespace) -> int:
    with connect_for(args, "remove limit") as conn:
        keys = FlowControl(conn).remove_limit(args.queue, args.key)
    text = f"{args.queue} {args.key}: limit removed ({keys} key(s) updated)"
    say(args, {"queue": args.queue, "key": args.key, "keys": keys}, text)
    return 0


def list_limits(args: argparse.Namespace) -> int:
    with connect_for(args, "list limits") as conn:
        limits = FlowControl(conn).limits(args.queue)
    if args.json:
        print(to_json(limits))
        return 0
    rows = [
        [lim.queue, lim.key_pattern, "-" if lim.max_running is None else lim.max_running,
         f"{lim.weight:g}",
         "-" if lim.per_second is None else f"{lim.per_second:g}/s burst {lim.burst or 1:g}",
         when(lim.updated_at)]
        for lim in limits
    ]  # fmt: skip
    headers = ["QUEUE", "KEY", "MAX RUNNING", "WEIGHT", "RATE", "UPDATED"]
    print(table(headers, rows) if rows else "no limits")
    return 0


def keys(args: argparse.Namespace) -> int:
    with connect_for(args, "flow status") as conn:
        flow = FlowControl(conn)
        status = flow.status(args.queue or None, limit=args.limit)
        blocked = flow.blocked(args.queue or None, limit=args.limit)
    if args.json:
        print(to_json({"keys": status, "blocked": blocked}))
        return 0
    print(flow_text(status, blocked) or "no keys with unfinished jobs, no blocked aggregates")
    return 0


def flow_text(status: list[Any], blocked: list[Any]) -> str:
    """The flow-control part of ``leaseq status`` ("" when no key has unfinished jobs)."""
    parts = []
    if status:
        rows = [
            [s.queue, s.key, "-" if s.max_running is None else s.max_running, s.running,
             s.held_silent or "", s.ready, s.claimable, "yes" if s.saturated else "",
             f"{s.vtime:.1f}", when(s.paused_until) if s.paused_until else ""]
            for s in status
        ]  # fmt: skip
        parts.append(
            table(
                [
                    "QUEUE",
                    "KEY",
                    "LIMIT",
                    "RUNNING",
                    "HELD BY SILENT",
                    "READY",
                    "CLAIMABLE",
                    "SATURATED",
                    "RUN S/WEIGHT",
                    "PAUSED UNTIL",
                ],
                rows,
            )
        )
    if blocked:
        rows = [[b.queue, b.ordering_key, b.head, when(b.blocked_at), b.waiting] for b in blocked]
        parts.append(
            "aggregates blocked by a dead head (retry it with `leaseq retry ID`, or skip "
            "it with `leaseq limits unblock QUEUE ORDERING_KEY`):\n"
            + table(["QUEUE", "ORDERING KEY", "DEAD HEAD", "SINCE", "WAITING"], rows)
        )
    return "\n\n".join(parts)


def resume(args: argparse.Namespace) -> int:
    with connect_for(args, "resume key") as conn:
        resumed = FlowControl(conn).resume(args.queue, args.key)
    text = (
        f"{args.queue} {args.key}: pause ended, its jobs are claimable"
        if resumed
        else f"{args.queue} {args.key}: not paused"
    )
    say(args, {"queue": args.queue, "key": args.key, "resumed": resumed}, text)
    return 0


def unblock(args: argparse.Namespace) -> int:
    with connect_for(args, "unblock") as conn:
        head = FlowControl(conn).unblock(args.queue, args.ordering_key)
    text = (
        f"{args.queue} {args.ordering_key}: next job {head} is claimable"
        if head is not None
        else f"{args.queue} {args.ordering_key}: nothing left to run"
    )
    say(args, {"queue": args.queue, "ordering_key": args.ordering_key, "head": head}, text)
    return 0


def add_commands(sub: Any, command: Any) -> None:
    """Add ``limits`` and its subcommands to the ``leaseq`` subparsers."""
    group = sub.add_parser(
        "limits",
        help="flow control: per-key concurrency and rate limits, fair-share weights",
        description="Limits per queue and key (or key pattern with *), applied at once to "
        "running workers. A lowered limit drains: running jobs finish, no new one starts "
        "past it.",
    ).add_subparsers(dest="limits_command", required=True)
    p = command("set", "set a key's (or pattern's) limit and weight", set_limit, group)
    p.add_argument("queue")
    p.add_argument("key", help="a key, or a pattern with * (an exact key beats a pattern)")
    p.description = (
        "Only the flags given change; a new limit starts with no concurrency or rate limit "
        "and weight 1. `--max-running none` or `--per-second none` removes that part; "
        "`leaseq limits remove` removes the whole limit."
    )
    p.add_argument(
        "--max-running", type=_or_none(int), default=argparse.SUPPRESS,
        help="at most N of its jobs running; none: no concurrency limit",
    )  # fmt: skip
    p.add_argument(
        "--weight", type=float, default=argparse.SUPPRESS, help="fair-share weight (new: 1)"
    )
    p.add_argument(
        "--per-second", type=_or_none(float), default=argparse.SUPPRESS,
        help="at most R job starts a second; none: no rate limit",
    )  # fmt: skip
    p.add_argument(
        "--burst", type=float, default=argparse.SUPPRESS,
        help="with a rate: starts allowed at once (new: 1)",
    )  # fmt: skip
    p = command("remove", "remove the limit set for a key or pattern", remove_limit, group)
    p.add_argument("queue")
    p.add_argument("key")
    p = command("list", "the limits set", list_limits, group)
    p.add_argument("queue", nargs="?")
    p = command("keys", "keys with unfinished jobs, saturated ones first; blocked aggregates",
                keys, group)  # fmt: skip
    p.add_argument("queue", nargs="*")
    p.add_argument("--limit", type=int, default=50, help="at most this many rows (default 50)")
    p = command("resume", "end a key's pause (a handler's back-off) now", resume, group)
    p.add_argument("queue")
    p.add_argument("key")
    p = command("unblock", "skip an aggregate's dead head: its next job runs", unblock, group)
    p.add_argument("queue")
    p.add_argument("ordering_key")


def _or_none(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: ``kind``, or ``none`` for None (remove that part of the limit)."""

    def parse(text: str) -> Any:
        return None if text.strip().lower() == "none" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error
    return parse
