"""``python -m bench.isolation --database-url URL [--repeats N]``: what ``--isolation
process`` and micro-batching cost and buy, with real ``leaseq worker`` processes.

Per configuration, N jobs are enqueued, one worker starts (start-up: from spawn until it
has registered, i.e. every slot has run ``on_startup``), and the run lasts until the
database says every job succeeded. Rows go to ``bench/results/isolation.csv``. Handlers:
:mod:`bench.isolation_app` (a no-op; a stand-in model costing 20 ms per call + 0.5 ms per
input, called per job or per batch of up to 32).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import leaseq
from bench.env import reset_leaseq, scratch_database

RESULTS = Path(__file__).parent / "results" / "isolation.csv"
HERE = Path(__file__).parent
QUEUE = "bench"

# (name, job type, jobs, isolation, concurrency)
CONFIGS = [
    ("noop", "noop", 2000, "thread", 2),
    ("noop", "noop", 2000, "process", 2),
    ("model_single", "infer", 400, "thread", 2),
    ("model_single", "infer", 400, "process", 2),
    ("model_batch32", "infer_batch", 400, "thread", 2),
    ("model_batch32", "infer_batch", 400, "process", 2),
]


def unfinished(queue: leaseq.Queue) -> int:
    return sum(s.ready + s.scheduled + s.running for s in queue.stats([QUEUE]))


def run_one(
    url: str, job_type: str, jobs: int, isolation: str, concurrency: int
) -> dict[str, float]:
    """Enqueue, start one worker, time start-up and the drain of every job."""
    reset_leaseq(url)
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        queue.enqueue_many([leaseq.JobSpec(QUEUE, job_type, i) for i in range(jobs)])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH", "")])
            ),
            "LEASEQ_DATABASE_URL": url,
        }
        cmd = [
            sys.executable, "-m", "leaseq.cli", "worker", "--app", "bench.isolation_app:registry",
            "--queue", QUEUE, "--concurrency", str(concurrency), "--isolation", isolation,
            "--metrics-port", "0", "--worker-id", "bench-w", "--log-level", "WARNING",
        ]  # fmt: skip
        with tempfile.TemporaryFile() as log:
            started = time.monotonic()
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                workers = leaseq.Workers(conn)
                while not workers.list():
                    assert proc.poll() is None, "worker exited"
                    time.sleep(0.01)
                ready = time.monotonic()
                while unfinished(queue):
                    assert proc.poll() is None, "worker exited"
                    time.sleep(0.02)
                done = time.monotonic()
            finally:
                proc.terminate()
                proc.wait(30)
        succeeded = conn.execute(
            "SELECT count(*) FROM leaseq.jobs WHERE status = 'succeeded'"
        ).fetchone()
        assert succeeded is not None and succeeded[0] == jobs, succeeded
    return {
        "startup_s": ready - started,
        "run_s": done - ready,
        "jobs_per_s": jobs / (done - ready),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.isolation", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("LEASEQ_BENCH_DATABASE_URL"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url (or LEASEQ_BENCH_DATABASE_URL) is required")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with scratch_database(args.database_url, "isolation") as url:
        for repeat in range(args.repeats):  # interleaved: load drifts over a run
            for name, job_type, jobs, isolation, concurrency in CONFIGS:
                m = run_one(url, job_type, jobs, isolation, concurrency)
                row = {
                    "scenario": name,
                    "isolation": isolation,
                    "concurrency": concurrency,
                    "jobs": jobs,
                    "repeat": repeat + 1,
                    **{k: round(v, 3) for k, v in m.items()},
                }
                print(row, flush=True)
                rows.append(row)
    with RESULTS.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
