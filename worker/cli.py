"""The ``leaseq`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from leaseq import settings
from leaseq.db import connect
from leaseq.errors import LeaseqError
from leaseq.migrate import migrate


def _cmd_migrate(args: argparse.Namespace) -> int:
    url = settings.require(settings.resolve(args, [settings.DATABASE_URL]), settings.DATABASE_URL)
    with connect(url, action="migrate") as conn:
        report = migrate(conn)
    done = ", ".join(f"{v:04d}" for v in report.applied) or "nothing to apply"
    print(f"leaseq schema at version {report.version} ({done})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leaseq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("migrate", help="create or upgrade leaseq's schema (idempotent)")
    settings.add_options(p, [settings.DATABASE_URL])
    p.set_defaults(func=_cmd_migrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except LeaseqError as exc:
        print(f"leaseq: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
