"""Micro-batching from a backlog: jobs per model call and throughput when the queue already
holds the work, against ``max_batch`` 1.

Per configuration, the backlog is enqueued before one ``leaseq worker --concurrency 1``
starts (:func:`bench.isolation.run_one`), with the default poll interval: a batch type
(``embed8``: ``max_batch`` 8, ``max_wait`` 0.5 s) and the same handler one job per call
(``embed1``), both calling :mod:`bench.isolation_app`'s stand-in model (20 ms per call +
0.5 ms per input). Every result names its model call, so the database says how many calls
ran. A batch that does not fill from the backlog runs short after ``max_wait``: it shows as
jobs per call well under ``max_batch`` and a throughput below the per-job arm.
"""

from __future__ import annotations

import leaseq
from bench.context import Context
from bench.env import scratch_database
from bench.isolation import run_one

NAME = "batching"
# (job type, its max_batch)
ARMS = [("embed8", 8), ("embed1", 1)]


def measure(
    url: str, job_type: str, max_batch: int, jobs: int, isolation: str
) -> dict[str, object]:
    """One run from a backlog of ``jobs``; one CSV row."""
    timing = run_one(url, job_type, jobs, isolation, 1)
    with leaseq.connect(url, action="bench") as conn:
        row = conn.execute(
            "SELECT count(DISTINCT result->>'call') FROM leaseq.jobs WHERE job_type = %s",
            [job_type],
        ).fetchone()
    calls = int(row[0]) if row else 0
    return {
        "job_type": job_type,
        "max_batch": max_batch,
        "isolation": isolation,
        "jobs": jobs,
        "model_calls": calls,
        "jobs_per_call": round(jobs / calls, 2) if calls else "",
        "run_s": round(timing["run_s"], 3),
        "jobs_per_s": round(timing["jobs_per_s"], 1),
        "startup_s": round(timing["startup_s"], 3),
    }


def run(ctx: Context) -> None:
    jobs, repeats = (48, 2) if ctx.quick else (240, 3)
    isolations = ("thread",) if ctx.quick else ("thread", "process")
    rows = []
    with scratch_database(ctx.server_url, NAME) as url:
        for repeat in range(repeats):  # interleaved: load drifts over a run
            for isolation in isolations:
                for job_type, max_batch in ARMS:
                    row = {
                        "repeat": repeat + 1,
                        **measure(url, job_type, max_batch, jobs, isolation),
                    }
                    ctx.log(
                        f"batching {job_type} {isolation}: {row['jobs_per_call']} jobs per call, "
                        f"{row['jobs_per_s']} jobs/s"
                    )
                    rows.append(row)
    recorder = ctx.recorder(NAME)
    recorder.params(
        {
            "jobs": jobs,
            "repeats": repeats,
            "concurrency": 1,
            "arms": ARMS,
            "max_wait_s": 0.5,
            "model": "20 ms per call + 0.5 ms per input (sleep)",
        }
    )
    recorder.table(NAME, rows)
