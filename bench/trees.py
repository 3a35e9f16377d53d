"""Before/after: the same no-op drain by two source trees of leaseq, alternated in one run.

``python -m bench.trees --before DIR --after DIR --database-url URL`` migrates a scratch
database with each tree's own code, then drains ``--jobs`` no-op jobs with ``--workers`` real
``leaseq worker`` processes of each tree in turn (A B B A, ``--repeats`` times), each drain
measured by ``bench/tree_run.py`` run inside that tree. A tree is a checkout, e.g. one made by
``git worktree add /tmp/before <commit>``.

CPU per job on a shared machine moves by up to 2x from one run to the next, so the versions
alternate and the medians are compared; the statement figures (statements, rows, buffers and
WAL bytes per job, from ``pg_stat_statements``) barely move, and say whether a difference is
the code's. Statement time (``exec_us_per_job``) is wall time inside the executor, and is not
comparable between a statement and a function that runs it: a function's inner plan is
fetched and locked during execution, a prepared statement's before it. The server should be
one this harness alone uses, with ``pg_stat_statements`` in ``shared_preload_libraries``:
server CPU is every process of that server, and its WAL is the drain's alone. Rows go to
``bench/results/<label>.csv``; medians are printed.

With ``--callgrind-dumps DIR``, ``--database-url`` is a server run under callgrind instead
(``valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=DIR/cg.%p postgres
-D DATA``), and each tree's server instructions per job are counted once
(``bench/tree_count.py``): a figure the machine's load cannot move.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg

from bench.env import machine, scratch_database, server_info
from bench.results import Recorder

HERE = Path(__file__).resolve().parent
# The figures summarised as medians per version, CPU first.
FIGURES = (
    "server_cpu_ms_per_job",
    "client_cpu_ms_per_job",
    "jobs_per_second",
    "exec_us_per_job",
    "statements_per_job",
    "rows_per_job",
    "blocks_per_job",
    "dirtied_per_job",
    "wal_bytes_per_job",
)


def _tree_env(tree: Path) -> dict[str, str]:
    paths = [tree / "worker", tree / "operator", tree / "sql", tree]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in paths)}


def _migrate(tree: Path, url: str) -> None:
    code = (
        "import sys, leaseq\n"
        "with leaseq.connect(sys.argv[1], action='migrate') as c: leaseq.migrate(c)"
    )
    subprocess.run(
        [sys.executable, "-P", "-c", code, url], env=_tree_env(tree), cwd=tree, check=True
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def _drain(tree: Path, url: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = [str(args.jobs), str(args.workers), str(args.concurrency), str(args.cap_seconds)]
    out = subprocess.run(
        [sys.executable, "-P", str(HERE / "tree_run.py"), url, *argv],
        env=_tree_env(tree),
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _count(tree: Path, url: str, dumps: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-P", str(HERE / "tree_count.py"), url, str(dumps)],
        env=_tree_env(tree),
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["server_instructions_per_job"])


def _median(rows: list[dict[str, Any]], figure: str) -> float:
    return statistics.median(float(r[figure]) for r in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trees", description=__doc__)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=HERE.parent)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="A B B A blocks")
    parser.add_argument("--cap-seconds", type=float, default=120.0)
    parser.add_argument("--label", default="trees", help="the CSV's name under bench/results")
    parser.add_argument("--callgrind-dumps", type=Path, help="count instructions instead")
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    if args.callgrind_dumps:
        counts = {}
        with ExitStack() as stack:
            for name, tree in trees.items():
                url = stack.enter_context(
                    scratch_database(args.database_url, f"count_{name}", migrate=False)
                )
                _migrate(tree, url)
                counts[name] = _count(tree, url, args.callgrind_dumps)
        change = (counts["after"] / counts["before"] - 1) * 100
        print(
            f"server instructions per job: before {counts['before']:.0f}, "
            f"after {counts['after']:.0f} ({change:+.1f}%)"
        )
        return
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        urls = {}
        for name, tree in trees.items():
            urls[name] = stack.enter_context(
                scratch_database(args.database_url, f"trees_{name}", migrate=False)
            )
            _migrate(tree, urls[name])
        order = ["before", "after", "after", "before"] * args.repeats
        for i, name in enumerate(order):
            result = _drain(trees[name], urls[name], args)
            top = result.pop("top")
            rows.append({"run": i, "version": name, **result})
            print(
                f"[trees] {i} {name}: server {result['server_cpu_ms_per_job']:.4f} "
                f"client {result['client_cpu_ms_per_job']:.4f} ms/job, "
                f"{result['jobs_per_second']:.0f} jobs/s, "
                f"exec {result['exec_us_per_job']:.2f} us/job, "
                f"blocks {result['blocks_per_job']:.2f}, wal {result['wal_bytes_per_job']:.0f}",
                file=sys.stderr,
                flush=True,
            )
            if i < 2:
                for s in top:
                    print(f"    {s}", file=sys.stderr)
    environment = {**machine(), **server_info(args.database_url)}
    recorder = Recorder(HERE / "results", args.label, "full", environment)
    # Not the server's URL: it may carry a password.
    recorder.params({k: str(v) for k, v in vars(args).items() if k != "database_url"})
    recorder.table(args.label, rows)
    for figure in FIGURES:
        before = _median([r for r in rows if r["version"] == "before"], figure)
        after = _median([r for r in rows if r["version"] == "after"], figure)
        change = (after / before - 1) * 100 if before else float("nan")
        print(f"{figure:24} before {before:10.4f}  after {after:10.4f}  {change:+6.1f}%")


if __name__ == "__main__":
    main()
