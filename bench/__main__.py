"""``python -m bench [--quick] [--database-url URL] [--only NAMES]`` runs the scenarios and writes
CSV, then the report; ``python -m bench report`` regenerates the report from the CSV alone."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import (
    ab,
    batching,
    capacity,
    claim_scaling,
    crash,
    flow,
    history,
    history_partitions,
    lease_renewal,
    ocr,
    peers,
    pipelines,
    report,
    result_latency,
    start,
    steps,
    throughput,
    txn_scope,
    wakes,
)
from bench.context import Context
from bench.env import machine, server, server_info

SCENARIOS: dict[str, Callable[[Context], None]] = {
    claim_scaling.NAME: claim_scaling.run,
    txn_scope.NAME: txn_scope.run,
    history.NAME: history.run,
    history_partitions.NAME: history_partitions.run,
    throughput.NAME: throughput.run,
    crash.NAME: crash.run,
    peers.NAME: peers.run,
    start.NAME: start.run,
    result_latency.NAME: result_latency.run,
    ab.NAME: ab.run,
    ocr.NAME: ocr.run,
    batching.NAME: batching.run,
    pipelines.NAME: pipelines.run,
    lease_renewal.NAME: lease_renewal.run,
    flow.NAME: flow.run,
    steps.NAME: steps.run,
    capacity.NAME: capacity.run,
    wakes.NAME: wakes.run,
}
# Run only when named with --only: a repeated, interleaved comparison for proposals; OCR
# inference (minutes of CPU per repeat on a loaded 2-core machine; needs the ocr extra);
# flow control (issue 20: keyed against keyless claims, a hot key's limit, the plan).
# durable steps (issue 49: a step's cost against a checkpoint's); durable sleeps' and
# signals' wake latency beside DBOS (issue 60: needs DBOS's own virtual environment).
OPT_IN = {ab.NAME, ocr.NAME, flow.NAME, steps.NAME, wakes.NAME}
# Run at a smoke size by --quick, in full only when named with --only: the capacity model of
# one primary (issue 52) takes two rounds of ten minutes.
FULL_OPT_IN = {capacity.NAME}

RESULTS = Path(__file__).parent / "results"
# The documentation page that shows the headline of the committed results.
HEADLINE_PAGE = Path(__file__).parents[1] / "docs" / "benchmarks" / "index.md"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("command", nargs="?", choices=("run", "report"), default="run")
    parser.add_argument("--quick", action="store_true", help="small configurations (< 3 min)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("LEASEQ_BENCH_DATABASE_URL"),
        help="server to use (each scenario creates and drops its own database); "
        "default: a throwaway embedded PostgreSQL",
    )
    parser.add_argument(
        "--only", default="", help=f"comma-separated scenarios to run: {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--churn-arms",
        default="leaseq,leaseq+reaper_vacuum_5s,control",
        help=f"history scenario's churn arms, from: {', '.join(history.ARMS)}",
    )
    parser.add_argument(
        "--peers",
        default="",
        help="comma-separated arms of the peers scenario (default: all), e.g. "
        "'leaseq worker,pgqueuer,dbos,chancy,oban'",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="folder for CSV, REPORT.md and plots (default bench/results, or bench/results/quick "
        "with --quick)",
    )
    return parser


def run(args: argparse.Namespace, folder: Path) -> int:
    names = [n.strip() for n in args.only.split(",") if n.strip()] or [
        n for n in SCENARIOS if n not in OPT_IN and (args.quick or n not in FULL_OPT_IN)
    ]
    unknown = [n for n in names if n not in SCENARIOS]
    unknown += [a for a in args.churn_arms.split(",") if a.strip() not in history.ARMS]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}", file=sys.stderr)
        return 2
    # The scenarios kill and reap workers on purpose; leaseq's warnings about it are expected.
    logging.getLogger("leaseq").setLevel(logging.ERROR)
    with server(args.database_url) as url:
        environment = {**machine(), **server_info(url)}
        for name in names:
            # Other load on the machine skews every timing: say how busy it was.
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            ctx = Context(
                url,
                args.quick,
                folder,
                {**environment, "loadavg_at_start": load},
                tuple(a.strip() for a in args.churn_arms.split(",") if a.strip()),
                tuple(a.strip() for a in args.peers.split(",") if a.strip()),
            )
            started = time.perf_counter()
            ctx.log(f"scenario {name} ({'quick' if args.quick else 'full'})")
            SCENARIOS[name](ctx)
            ctx.log(f"scenario {name} done in {time.perf_counter() - started:.0f} s")
    _report(folder)
    print(f"report: {folder / 'REPORT.md'}", file=sys.stderr)
    return 0


def _report(folder: Path) -> None:
    """REPORT.md from the CSV; for the committed results, the benchmarks page's headline too."""
    report.generate(folder)
    if folder.resolve() == RESULTS.resolve():
        report.update_readme(HEADLINE_PAGE, folder)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    folder = args.results or (RESULTS / "quick" if args.quick else RESULTS)
    if args.command == "report":
        _report(folder)
        print(folder / "REPORT.md")
        return 0
    return run(args, folder)


if __name__ == "__main__":
    sys.exit(main())
