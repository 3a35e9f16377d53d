"""``leaseq operator``: scale WorkerPools from queue depth and reap expired leases."""

from __future__ import annotations

import argparse
import logging
import sys

import kopf

from leaseq import config as settings
from leaseq.core.errors import LeaseqError
from leaseq.core.redact import redact, redact_logs
from leaseq_operator.config import OPTIONS, OperatorConfig
from leaseq_operator.kube import Cluster
from leaseq_operator.runner import run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leaseq operator", description=__doc__)
    settings.add_options(parser, OPTIONS)
    return parser


def configure_logging(config: OperatorConfig) -> None:
    log_format = kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(log_format=log_format)
    logging.getLogger().setLevel(config.log_level)
    redact_logs()


def main(argv: list[str]) -> int:
    """Run the operator until SIGTERM/SIGINT; 2 on a configuration or start-up error."""
    args = build_parser().parse_args(argv)
    try:
        config = OperatorConfig.from_args(args)
        configure_logging(config)
        run(config, Cluster.from_environment())
    except LeaseqError as exc:
        print(f"leaseq operator: error: {redact(str(exc))}", file=sys.stderr)
        return 2
    return 0
