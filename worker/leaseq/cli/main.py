"""The ``leaseq`` command line."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import signal
import sys
from collections.abc import Sequence

from leaseq import config as settings
from leaseq.cli import commands
from leaseq.core import redact
from leaseq.core.db import connect
from leaseq.core.errors import ConfigError, LeaseqError
from leaseq.core.history import History
from leaseq.core.schema import ComponentRoles, ConsoleRole, known_migrations, migrate
from leaseq.runtime import settings as worker_settings


def _cmd_migrate(args: argparse.Namespace) -> int:
    values = settings.resolve(
        args, [settings.DATABASE_URL, *settings.GRANT_OPTIONS, *settings.CONSOLE_GRANT_OPTIONS]
    )
    url = settings.require(values, settings.DATABASE_URL)
    roles = ComponentRoles(
        worker=values["worker_role"],
        operator=values["operator_role"],
        producer=values["producer_role"],
    )
    console = None
    if values["console_role"]:
        console = ConsoleRole(
            values["console_role"],
            admin=values["console_admin"],
            replace=values["console_replace"],
        )
    with connect(url, action="migrate") as conn:
        report = migrate(conn, roles, console)
    done = ", ".join(f"{v:04d}" for v in report.applied) or "nothing to apply"
    print(f"leaseq schema at version {report.version} ({done})")
    for statement in report.grants:
        print(f"  {statement}")
    history = [m.version for m in known_migrations() if m.name.startswith("history")]
    if set(history) & set(report.applied):
        with connect(url, action="migrate") as conn:
            waiting = History(conn).waiting(hot_retention=settings.HOT_RETENTION.default)
        # The migration moved nothing: a long transaction over every finished row would
        # hold locks the workers need. The leader's mover moves them in batches.
        print(
            f"history: {waiting.finished} finished job(s) stay in leaseq.jobs for now; the "
            "leader (`leaseq operator` or `leaseq reaper`) moves those older than its "
            f"--hot-retention (default {settings.HOT_RETENTION.default:g} s: {waiting.due} now) "
            "to leaseq.job_history in batches, with workers running"
        )
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from leaseq.runtime import logs, telemetry
    from leaseq.runtime.registry import load_app
    from leaseq.runtime.shutdown import SignalWatch
    from leaseq.runtime.worker import Worker

    config = worker_settings.WorkerSettings.from_args(args)
    logs.configure(config.log_level, config.log_format)
    # Before the app is loaded: what it imports finds the tracer provider set.
    stop_tracing = telemetry.configure()
    # Like other worker CLIs, find --app in the working directory too (last, so it never
    # shadows an installed module).
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    worker = Worker(config, load_app(config.app))
    signals = SignalWatch()
    signals.install()
    try:
        return worker.run(signals)
    finally:
        signals.retire()
        signals.close()
        stop_tracing()


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.steps:
        from leaseq.demo import steps

        url = settings.resolve(args, [settings.DATABASE_URL])["database_url"]
        return steps.run(url, args.documents)
    if args.pipeline:
        try:
            from leaseq.demo import pipeline
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"--pipeline needs the ocr extra: pip install 'leaseq[ocr]' ({exc})"
            ) from exc
        url = settings.resolve(args, [settings.DATABASE_URL])["database_url"]
        return pipeline.run(url, args.documents, args.pages)
    if args.ocr:
        try:
            from leaseq.demo import ocr
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"--ocr needs the ocr extra: pip install 'leaseq[ocr]' ({exc})"
            ) from exc
        url = settings.resolve(args, [settings.DATABASE_URL])["database_url"]
        return ocr.run(url, args.documents, args.pages)
    from leaseq.demo import run as demo

    return demo.main(args)


def _cmd_operator(args: argparse.Namespace) -> int:
    # Imported here so every other command works where the operator's dependencies are absent.
    try:
        operator_cli = importlib.import_module("leaseq_operator.cli")
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"`leaseq operator` needs the operator extra: pip install 'leaseq[operator]' "
            f"(missing module {exc.name!r})"
        ) from exc
    from leaseq.runtime import telemetry

    # The leader's schedule firings start traces (docs/guides/tracing.md).
    stop_tracing = telemetry.configure()
    try:
        return int(operator_cli.main(list(args.rest)))
    finally:
        stop_tracing()


DESCRIPTION = (
    "leaseq: a PostgreSQL work queue for slow jobs. Every command takes --database-url "
    "(or LEASEQ_DATABASE_URL); `leaseq COMMAND --help` describes each one."
)


def _cmd_reaper(args: argparse.Namespace) -> int:
    from leaseq.runtime import logs, telemetry
    from leaseq.runtime.shutdown import SignalWatch
    from leaseq_operator import standalone

    config = standalone.ReaperConfig.from_args(args)
    logs.configure(config.log_level, config.log_format)
    # The leader's schedule firings start traces (docs/guides/tracing.md).
    stop_tracing = telemetry.configure()
    signals = SignalWatch()
    signals.install()
    try:
        standalone.serve(config, lambda: signals.wait(0, None))
    finally:
        signals.retire()
        signals.close()
        stop_tracing()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leaseq", description=DESCRIPTION)
    parser.add_argument(
        "--version", action="version", version=f"leaseq {importlib.metadata.version('leaseq')}"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "migrate",
        help="create or upgrade leaseq's schema (idempotent)",
        description="Create or upgrade leaseq's schema (everything lives in the `leaseq` schema). "
        "Safe to run again and from several places at once; refuses, changing nothing, a "
        "database migrated by a newer leaseq.",
    )
    settings.add_options(
        p, [settings.DATABASE_URL, *settings.GRANT_OPTIONS, *settings.CONSOLE_GRANT_OPTIONS]
    )
    p.set_defaults(func=_cmd_migrate)

    p = sub.add_parser(
        "worker",
        help="run jobs: claim, run handlers, renew leases; drains on SIGTERM",
        description="Run a worker process. Every flag falls back to its LEASEQ_* variable.",
    )
    settings.add_options(p, worker_settings.OPTIONS)
    p.set_defaults(func=_cmd_worker)

    commands.add_commands(sub)

    p = sub.add_parser(
        "demo",
        help="see leaseq survive crashes: 3 workers, a SIGKILL and a SIGTERM, in under a minute",
        description="Enqueue simulated inference jobs, run 3 worker processes, SIGKILL one and "
        "SIGTERM another mid-job, then account for every job; exit status 1 if an invariant "
        "broke. Uses an embedded PostgreSQL unless --database-url is given (LEASEQ_DATABASE_URL "
        "is ignored: the demo migrates its database and leaves its jobs there).",
    )
    settings.add_options(p, [settings.DATABASE_URL])
    p.add_argument("--jobs", type=int, default=36, help="simulated inference jobs (default 36)")
    p.add_argument(
        "--ocr",
        action="store_true",
        help="run the OCR example instead: a real model reads rendered documents, one worker "
        "is SIGKILLed mid-document (needs the ocr extra)",
    )
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="run the OCR pipeline instead: split, a job per page, merge; one worker is "
        "SIGKILLed during the fan-in (born-digital pages: no model, seconds; needs the ocr extra)",
    )
    p.add_argument(
        "--steps",
        action="store_true",
        help="run agent jobs instead, two paid model calls each as durable steps; one worker "
        "is SIGKILLed between the two calls, and no call is paid twice",
    )
    p.add_argument(
        "--documents",
        type=int,
        default=4,
        help="with --ocr or --pipeline: documents; with --steps: jobs (default 4)",
    )
    p.add_argument(
        "--pages", type=int, default=4, help="with --ocr or --pipeline: pages each (default 4)"
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="leave the embedded PostgreSQL running afterwards, to look at it with "
        "`leaseq status` (the demo prints the command, and how to stop it)",
    )
    p.add_argument(
        "--stop",
        metavar="DIR",
        help="stop a PostgreSQL kept by --keep and delete its directory DIR, then exit",
    )
    p.set_defaults(func=_cmd_demo)

    from leaseq_operator import standalone

    p = sub.add_parser(
        "reaper",
        help="bring back jobs whose worker died, without Kubernetes (one of N copies reaps)",
        description="Run the reaper outside Kubernetes: the operator's leader lease and reap "
        "pass. Every flag falls back to its LEASEQ_* variable.",
    )
    settings.add_options(p, standalone.OPTIONS)
    p.set_defaults(func=_cmd_reaper)

    from leaseq.cli import console as console_cli

    console_cli.add_command(sub)

    p = sub.add_parser("operator", add_help=False, help="run the Kubernetes operator")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_operator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    redact.install_hooks()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["operator"]:
        # Everything after `operator` is the operator's own command line, flags included.
        args = argparse.Namespace(func=_cmd_operator, rest=argv[1:])
    else:
        args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except LeaseqError as exc:
        print(f"leaseq: error: {redact.redact(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """The reader of stdout closed it (``leaseq jobs list | head``): stop quietly, the way
    command-line tools do on SIGPIPE, with 128 + SIGPIPE as the exit status."""
    # Point stdout at /dev/null so the interpreter's final flush cannot fail again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE
