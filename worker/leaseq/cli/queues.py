"""``leaseq queues give/show``: which database roles may use a queue (a deployment's
tenants), through :class:`leaseq.QueueRoles`. Run as the owner of leaseq's tables."""

from __future__ import annotations

import argparse
from typing import Any

from leaseq.cli.args import connect_for, say
from leaseq.cli.tables import table, to_json
from leaseq.core.tenants import QueueRoles, QueueUse

#: The value of --workers or --producers that opens a queue to every role again.
ALL = "all"


def give(args: argparse.Namespace) -> int:
    given = {QueueUse.WORKER: args.workers, QueueUse.PRODUCER: args.producers}
    if all(v is None for v in given.values()):
        raise SystemExit("leaseq queues give: name --workers, --producers or both")
    now: dict[str, list[str]] = {}
    with connect_for(args, "give queue") as conn:
        roles = QueueRoles(conn)
        for use, value in given.items():
            if value is not None:
                names = [] if value.strip() == ALL else [n.strip() for n in value.split(",")]
                now[use.value] = roles.give(args.queue, use, [n for n in names if n])
    text = "; ".join(
        f"{args.queue} {use}s: {', '.join(names) if names else 'every ' + use + ' role'}"
        for use, names in now.items()
    )
    say(args, {"queue": args.queue, **now}, text)
    return 0


def show(args: argparse.Namespace) -> int:
    with connect_for(args, "show queue roles") as conn:
        given = QueueRoles(conn).list()
    if args.json:
        print(to_json(given))
        return 0
    rows = [[g.queue, g.use.value, g.role] for g in given]
    print(table(["QUEUE", "USE", "ROLE"], rows) if rows else "every queue is open to every role")
    return 0


def add_commands(sub: Any, command: Any) -> None:
    """Add ``queues`` and its subcommands to the ``leaseq`` subparsers."""
    group = sub.add_parser(
        "queues",
        help="tenants: give a queue to worker and producer roles",
        description="A queue given to no role is open to every worker and producer role. "
        "Given to roles, only their member logins claim from it (workers) or enqueue into it "
        "(producers). Run as the owner of leaseq's tables.",
    ).add_subparsers(dest="queues_command", required=True)
    p = command("give", "give a queue to roles, replacing the ones it had", give, group)
    p.add_argument("queue")
    p.add_argument(
        "--workers", metavar="ROLE[,ROLE]",
        help=f"worker roles that may claim from it; {ALL}: every worker role again",
    )  # fmt: skip
    p.add_argument(
        "--producers", metavar="ROLE[,ROLE]",
        help=f"producer roles that may enqueue into it; {ALL}: every producer role again",
    )  # fmt: skip
    command("show", "the queues given to roles", show, group)
