"""``leaseq steps list/resolve``: durable steps (``ctx.step``) whose outcome is uncertain,
listed and settled by an operator, through :class:`leaseq.Queue` (the same calls as in
Python)."""

from __future__ import annotations

import argparse
import getpass
import json
from typing import Any

from leaseq.cli.args import connect_for, say
from leaseq.cli.tables import table, to_json, when
from leaseq.core import validation
from leaseq.core.errors import InvalidJob
from leaseq.core.models import StepRecord, UncertainStep
from leaseq.core.queue import Queue

#: Uncertain steps `leaseq status` and `leaseq steps list` show at most.
SHOWN = 100


def uncertain_text(found: list[UncertainStep]) -> str:
    """The uncertain-steps part of ``leaseq status`` ("" when there are none)."""
    if not found:
        return ""
    rows = [[u.job_id, u.queue, u.job_type, u.name, u.attempt, when(u.intended_at)] for u in found]
    more = f"\n(the first {SHOWN} shown)" if len(found) >= SHOWN else ""
    return (
        f"{len(found)} job(s) held at an uncertain step need a human: settle each with"
        " `leaseq steps resolve JOB STEP --result JSON` or `--retry`\n"
        + table(["JOB", "QUEUE", "TYPE", "STEP", "ATTEMPT", "INTENDED"], rows)
        + more
    )


def steps_text(steps: list[StepRecord]) -> str:
    """A job's steps, for ``leaseq jobs show``."""
    rows = []
    for s in steps:
        state = "recorded" if s.recorded else "uncertain" if s.intended else "to run again"
        resolved = (
            f"{s.resolved_by} {when(s.resolved_at)}: {s.resolve_reason}" if s.resolved_by else ""
        )
        shown = json.dumps(s.result) if s.recorded else ""
        rows.append([s.name, state, s.attempt or "-", when(s.finished_at), shown[:60], resolved])
    return table(["STEP", "STATE", "ATTEMPT", "RECORDED", "RESULT", "RESOLVED"], rows)


def list_uncertain(args: argparse.Namespace) -> int:
    with connect_for(args, "list uncertain steps") as conn:
        found = Queue(conn).uncertain_steps(limit=SHOWN)
    if args.json:
        print(to_json(found))
        return 0
    print(uncertain_text(found) or "no uncertain steps")
    return 0


def resolve(args: argparse.Namespace) -> int:
    if (args.result is None) == (not args.retry):
        raise InvalidJob("--result/--retry", "give exactly one: what the effect was, or --retry")
    result = None if args.result is None else validation.json_text("--result", args.result)
    with connect_for(args, "resolve step") as conn:
        Queue(conn).resolve_step(
            args.job_id,
            args.step,
            result=result,
            retry=args.retry,
            actor=args.by or getpass.getuser(),
            reason=args.reason,
        )
    settled = "will run again" if args.retry else "has its result recorded"
    say(
        args,
        {"job_id": args.job_id, "step": args.step, "retry": args.retry, "status": "pending"},
        f"job {args.job_id}: step {args.step!r} {settled}; the job is pending again",
    )
    return 0


def add_commands(sub: Any, command: Any) -> None:
    """Add ``steps list`` and ``steps resolve`` to the ``leaseq`` subparsers."""
    group = sub.add_parser(
        "steps",
        help="durable steps whose outcome is uncertain: list and settle them",
        description="A job whose step committed its intent and recorded no result (its worker "
        "died inside it) and that has no reconcile check nor idempotent=True stops as held "
        "(error code StepUncertain): not finished, so its result, pipeline and stream wait and "
        "signals to it are kept. Find out whether the step's effect happened, then settle it: "
        "the job runs again from that step.",
    ).add_subparsers(dest="steps_command", required=True)
    command("list", "jobs held at an uncertain step", list_uncertain, group)
    p = command(
        "resolve",
        "settle an uncertain step (audited: who, when, why) and make its job pending again",
        resolve,
        group,
    )
    p.add_argument("job_id", type=int)
    p.add_argument("step", help="the step's name")
    p.add_argument("--result", metavar="JSON", help="the effect happened: record this result")
    p.add_argument("--retry", action="store_true", help="it did not happen: run the step again")
    p.add_argument("--reason", required=True, help="why (recorded with the step)")
    p.add_argument("--by", help="who settles it (default: the login user)")
