"""Scenario 5 (seed 000): SIGKILL a worker mid-job and time the recovery.

A victim process claims the only job, renews its lease every ``heartbeat`` seconds from a
thread, and is killed with SIGKILL ``kill_after`` seconds into the job. A survivor process
polls for work; a reaper loop in this process calls ``Queue.reap`` every ``reap_every``
seconds. All times are database times relative to the kill: lease expiry, reap (the attempt
recorded as lease_expired), reclaim by the survivor, and completion.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from leaseq.runtime.claims import ClaimPlanner

NAME = "crash"
QUEUE = "bench"
_CONTEXT = multiprocessing.get_context("forkserver")


@dataclass(frozen=True)
class Setting:
    lease: float
    heartbeat: float
    reap_every: float
    job_seconds: float
    kill_after: float


def victim(url: str, setting: Setting) -> None:
    """Claim the job, heartbeat from a thread, work until killed."""
    _work(url, "victim", setting, poll=0.05)


def survivor(url: str, setting: Setting) -> None:
    """Poll for the job until it is done, then exit."""
    _work(url, "survivor", setting, poll=0.1)


def _work(url: str, owner: str, setting: Setting, poll: float) -> None:
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        while True:
            jobs = queue.claim([QUEUE], owner, lease_seconds=setting.lease, plan=plan)
            if jobs:
                break
            time.sleep(poll)
        lease = jobs[0].lease
        done = threading.Event()

        def beat() -> None:
            with leaseq.connect(url, action="heartbeat") as beat_conn:
                beats = leaseq.Queue(beat_conn)
                while not done.wait(setting.heartbeat):
                    beats.heartbeat(lease, lease_seconds=setting.lease)

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        time.sleep(setting.job_seconds)
        done.set()
        thread.join()
        queue.complete(lease)


def _reaper(url: str, every: float, halt: threading.Event) -> None:
    with leaseq.connect(url, action="reap") as conn:
        queue = leaseq.Queue(conn)
        while not halt.wait(every):
            queue.reap()


def timeline(url: str, setting: Setting) -> dict[str, Any]:
    """One kill-and-recover run; one CSV row of seconds relative to the kill."""
    reset_leaseq(url)
    with psycopg.connect(url, autocommit=True) as conn:
        job_id = leaseq.Queue(conn).enqueue(QUEUE, "slow").job_id
        proc = _CONTEXT.Process(target=victim, args=(url, setting))
        proc.start()
        while conn.execute(
            "SELECT status::text FROM leaseq.jobs WHERE id = %s", [job_id]
        ).fetchone() != ("running",):
            time.sleep(0.02)
        time.sleep(setting.kill_after)
        os.kill(proc.pid or 0, signal.SIGKILL)
        killed = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp())::float8,"
            "       extract(epoch FROM lease_expires_at)::float8,"
            "       extract(epoch FROM heartbeat_at)::float8"
            "  FROM leaseq.jobs WHERE id = %s",
            [job_id],
        ).fetchone()
        assert killed is not None
        proc.join()
        halt = threading.Event()
        reaper = threading.Thread(target=_reaper, args=(url, setting.reap_every, halt))
        reaper.start()
        rescuer = _CONTEXT.Process(target=survivor, args=(url, setting))
        rescuer.start()
        rescuer.join(timeout=setting.lease * 3 + setting.job_seconds + 60)
        halt.set()
        reaper.join()
        attempts = conn.execute(
            "SELECT attempt, outcome::text, extract(epoch FROM started_at)::float8,"
            "       extract(epoch FROM ended_at)::float8"
            "  FROM leaseq.job_attempts WHERE job_id = %s ORDER BY lease_token",
            [job_id],
        ).fetchall()
        final = conn.execute(
            "SELECT status::text, attempt_count, extract(epoch FROM available_at)::float8"
            "  FROM leaseq.jobs WHERE id = %s",
            [job_id],
        ).fetchone()
    kill_at, expires_at, beat_at = killed
    reaped = next((a for a in attempts if a[1] == "lease_expired"), None)
    finished = next((a for a in attempts if a[1] == "succeeded"), None)

    def since_kill(at: float | None) -> float | str:
        return "" if at is None else round(at - kill_at, 3)

    return {
        "lease_s": setting.lease,
        "heartbeat_s": setting.heartbeat,
        "reap_every_s": setting.reap_every,
        "job_s": setting.job_seconds,
        "heartbeat_age_at_kill_s": round(kill_at - beat_at, 3),
        "lease_left_at_kill_s": round(expires_at - kill_at, 3),
        "expired_after_s": since_kill(expires_at),
        "retry_at_after_s": since_kill(final[2] if final else None),
        "reaped_after_s": since_kill(reaped[3] if reaped else None),
        "reclaimed_after_s": since_kill(finished[2] if finished else None),
        "finished_after_s": since_kill(finished[3] if finished else None),
        "final_status": final[0] if final else "",
        "attempt_count": final[1] if final else "",
        "attempt_outcomes": " ".join(a[1] for a in attempts),
    }


def run(ctx: Context) -> None:
    if ctx.quick:
        settings = [Setting(2.0, 0.5, 0.5, 1.0, 0.5)]
    else:
        settings = [
            Setting(10.0, 3.0, 1.0, 4.0, 1.0),  # the article's lease and heartbeat
            Setting(5.0, 1.0, 1.0, 4.0, 1.0),
            Setting(30.0, 10.0, 5.0, 4.0, 1.0),  # leaseq's defaults (worker and reaper)
        ]
    rows = []
    with scratch_database(ctx.server_url, "crash") as url:
        for setting in settings:
            row = timeline(url, setting)
            ctx.log(
                f"crash lease {setting.lease}s heartbeat {setting.heartbeat}s: "
                f"reclaimed after {row['reclaimed_after_s']} s, finished after "
                f"{row['finished_after_s']} s ({row['attempt_outcomes']})"
            )
            rows.append(row)
    recorder = ctx.recorder(NAME)
    recorder.params(
        {"settings": [s.__dict__ for s in settings], "retry_backoff": "leaseq default RetryPolicy"}
    )
    recorder.table(NAME, rows)
