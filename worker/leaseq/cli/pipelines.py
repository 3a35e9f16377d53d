"""``leaseq pipelines list/show/cancel``: pipelines' progress (one indexed row each, kept by
the transitions of their jobs: nothing is counted at read time) and their jobs, paged."""

from __future__ import annotations

import argparse
from typing import Any

from leaseq.cli.args import connect_for, say
from leaseq.cli.tables import cancelled_counts, key_values, table, to_json, when
from leaseq.core.models import PipelineRecord
from leaseq.core.queue import Queue


def _state(p: PipelineRecord) -> str:
    if not p.finished:
        return "running"
    return "succeeded" if p.succeeded == p.total else "finished with failures"


def list_pipelines(args: argparse.Namespace) -> int:
    with connect_for(args, "list pipelines") as conn:
        found = Queue(conn).pipelines(
            before=args.before, unfinished=args.unfinished, limit=args.limit
        )
    if args.json:
        print(to_json(found))
        return 0
    if not found:
        print("no pipelines")
        return 0
    print(
        table(
            [
                "ID",
                "NAME",
                "STATE",
                "JOBS",
                "SUCCEEDED",
                "DEAD",
                "CANCELLED",
                "CREATED",
                "FINISHED",
            ],
            [
                [
                    p.id,
                    p.name,
                    _state(p),
                    p.total,
                    p.succeeded,
                    p.dead,
                    p.cancelled,
                    when(p.created_at),
                    when(p.finished_at),
                ]
                for p in found
            ],
        )
    )
    if len(found) == args.limit:
        print(f"\nmore: leaseq pipelines list --before {found[-1].id}")
    return 0


def show(args: argparse.Namespace) -> int:
    with connect_for(args, "show pipeline") as conn:
        queue = Queue(conn)
        found = queue.pipeline(args.pipeline_id)
        jobs = queue.pipeline_jobs(args.pipeline_id, after_id=args.after, limit=args.limit)
    if args.json:
        print(to_json({"pipeline": found, "jobs": jobs}))
        return 0
    fields = [
        ("id", found.id),
        ("name", found.name),
        ("state", _state(found)),
        ("jobs", found.total),
        ("unfinished", found.unfinished),
        ("succeeded", found.succeeded),
        ("dead", found.dead),
        ("cancelled", found.cancelled),
        ("created", when(found.created_at)),
        ("finished", when(found.finished_at)),
    ]
    print(key_values(fields))
    print()
    print(
        table(
            ["JOB", "TYPE", "STATUS", "PARENTS LEFT", "CANCELLED BY"],
            [
                [
                    j["job_id"],
                    j["job_type"],
                    j["status"],
                    j["deps_left"],
                    j["cancelled_by"] or "-",
                ]
                for j in jobs
            ],
        )
    )
    if len(jobs) == args.limit:
        print(f"\nmore: leaseq pipelines show {found.id} --after {jobs[-1]['job_id']}")
    return 0


def cancel(args: argparse.Namespace) -> int:
    with connect_for(args, "cancel") as conn:
        done = Queue(conn).cancel_pipeline(args.pipeline_id, reason=args.reason)
    say(
        args,
        done,
        f"pipeline {done.pipeline_id}: {done.cancelled} unfinished job(s) cancelled; "
        + cancelled_counts(done.pending, done.running),
    )
    return 0


def add_commands(sub: Any, command: Any) -> None:
    """Add ``pipelines`` and its subcommands to the ``leaseq`` subparsers."""
    group = sub.add_parser(
        "pipelines",
        help="pipelines (graphs of jobs): list, show, cancel",
        description="Pipelines: jobs that wait for jobs. Progress is kept by the jobs' own "
        "transitions, so showing it is one indexed row.",
    ).add_subparsers(dest="pipelines_command", required=True)
    p = command("list", "pipelines, newest first (a keyset page)", list_pipelines, group)
    p.add_argument("--before", type=int, help="only pipelines with a smaller id (next page)")
    p.add_argument("--unfinished", action="store_true", help="only unfinished pipelines")
    p.add_argument("--limit", type=int, default=50)
    p = command("show", "one pipeline's progress and its jobs (a keyset page)", show, group)
    p.add_argument("pipeline_id", type=int)
    p.add_argument("--after", type=int, default=0, help="jobs with a larger id (next page)")
    p.add_argument("--limit", type=int, default=100)
    p = command(
        "cancel",
        "cancel every unfinished job of a pipeline (running ones are fenced)",
        cancel,
        group,
    )
    p.add_argument("pipeline_id", type=int)
    p.add_argument("--reason")
