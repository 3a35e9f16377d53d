"""Scenario (issue 19): the server CPU spent keeping N leases alive.

N running jobs (N = 100, 1,000, 10,000), held by N / SLOTS simulated workers of SLOTS slots
each, are renewed once per round on one worker session (``tune_worker_session``: generic
plans, as every worker plans). Two ways:

* ``per_lease``: one ``heartbeat()`` statement per lease (how workers renewed before);
* ``per_worker``: one ``heartbeat_many()`` statement per worker for all its leases.

Each with statistics ``stale`` (taken while the jobs were pending, as right after a backlog
is enqueued and analyzed) or ``fresh`` (taken once they run). The CPU is the serving
backend's own (user + system, from /proc/<pid>/stat, so the server must be on this host),
per round; ``core_pct_at_10s`` is that as a share of one core when every lease is renewed
every 10 s (the default heartbeat interval); ``wal_bytes_per_lease`` the WAL one renewal
writes (a renewal that must write index entries writes more, and leaves more for vacuum).

``lease_renewal_passes``: what else N running jobs cost the leader, on the same held jobs
(none expired): one reaper pass (``reap``) and one read of the operator's work estimate
(``work``), CPU of the serving backend per call, and ``core_pct_at_5s`` at one of each per
5 s (the default reap interval).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from bench.stats import percentile

NAME = "lease_renewal"
SLOTS = 8
ROUNDS = 3
RENEWALS = 10_000
ARMS = ("per_lease", "per_worker")
HEARTBEAT_SECONDS = 10.0
REAP_SECONDS = 5.0
#: Calls per measurement of a leader's pass.
PASSES = 200
TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) the backend ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def hold(url: str, leases: int, *, fresh: bool) -> list[list[leaseq.Lease]]:
    """``leases`` running jobs, claimed SLOTS at a time by one owner each; their leases by
    owner. Statistics are taken before the claims, and again after them when ``fresh``."""
    reset_leaseq(url)
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        queue.enqueue_many([leaseq.JobSpec("q", "noop") for _ in range(leases)])
        conn.execute("ANALYZE leaseq.jobs")
        held = []
        for w in range(leases // SLOTS):
            claimed = queue.claim(["q"], f"w{w}", limit=SLOTS, lease_seconds=3600)
            held.append([job.lease for job in claimed])
        if fresh:
            conn.execute("ANALYZE leaseq.jobs")
    return held


def rounds(
    url: str, held: list[list[leaseq.Lease]], arm: str, renewals: int
) -> tuple[list[float], list[float]]:
    """CPU seconds of the serving backend per round of renewing every lease once (each
    measured over enough rounds for at least ``renewals`` renewals: the clock ticks at 10 ms),
    and the bytes of WAL written per round (read outside the measured CPU)."""
    leases = sum(len(h) for h in held)
    repeat = max(1, renewals // leases)
    spent, wal = [], []
    with leaseq.connect(url, action="bench") as conn:
        leaseq.Queue.tune_worker_session(conn)
        queue = leaseq.Queue(conn)
        pid = conn.info.backend_pid
        for _ in range(ROUNDS + 1):  # the first round prepares the statements: not counted
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
            conn.commit()
            before = backend_cpu(pid)
            for _ in range(repeat):
                for mine in held:
                    if arm == "per_lease":
                        for lease in mine:
                            queue.heartbeat(lease, lease_seconds=3600)
                    else:
                        queue.heartbeat_many(mine, lease_seconds=3600)
            spent.append((backend_cpu(pid) - before) / repeat)
            written = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", lsn).fetchone()
            conn.commit()
            wal.append(float(written[0] if written else 0) / repeat)
    return spent[1:], wal[1:]


def passes(url: str, leases: int, stats: str) -> list[dict[str, Any]]:
    """The CPU of one reaper pass and of one read of the work estimate, with ``leases``
    running jobs held (none expired), on a worker-tuned session: a row each."""
    rows = []
    with leaseq.connect(url, action="bench") as conn:
        leaseq.Queue.tune_worker_session(conn)
        queue = leaseq.Queue(conn)
        pid = conn.info.backend_pid
        calls: dict[str, Callable[[], object]] = {
            "reap": queue.reap,
            "work": lambda: queue.work(["q"], window=300),
        }
        for duty, call in calls.items():
            call()  # prepares the statement: not counted
            before = backend_cpu(pid)
            for _ in range(PASSES):
                call()
            per_call = (backend_cpu(pid) - before) / PASSES
            rows.append(
                {
                    "leases": leases,
                    "statistics": stats,
                    "duty": duty,
                    "cpu_ms_per_call": round(per_call * 1000, 2),
                    "core_pct_at_5s": round(per_call / REAP_SECONDS * 100, 3),
                }
            )
    return rows


def measure(
    url: str, sizes: list[int], arms: tuple[str, ...] = ARMS, renewals: int = RENEWALS
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One row per size, statistics and arm; and one per size, statistics and leader duty."""
    rows, duties = [], []
    for leases in sizes:
        for stats in ("stale", "fresh"):
            held = hold(url, leases, fresh=stats == "fresh")
            duties += passes(url, leases, stats)
            for arm in arms:
                cpu, wal = rounds(url, held, arm, renewals)
                mid = percentile(cpu, 50)
                rows.append(
                    {
                        "leases": leases,
                        "statistics": stats,
                        "arm": arm,
                        "statements_per_round": len(held) * (SLOTS if arm == "per_lease" else 1),
                        "cpu_ms_per_round_min": round(min(cpu) * 1000, 1),
                        "cpu_ms_per_round_p50": round(mid * 1000, 1),
                        "cpu_ms_per_round_max": round(max(cpu) * 1000, 1),
                        "cpu_us_per_lease": round(mid / leases * 1e6, 2),
                        "core_pct_at_10s": round(mid / HEARTBEAT_SECONDS * 100, 3),
                        "wal_bytes_per_lease": round(percentile(wal, 50) / leases),
                    }
                )
    return rows, duties


def run(ctx: Context) -> None:
    sizes = [100, 1000] if ctx.quick else [100, 1000, 10000]
    renewals = 2000 if ctx.quick else RENEWALS
    with scratch_database(ctx.server_url, "renewal") as url:
        with psycopg.connect(url) as probe:
            if not Path(f"/proc/{probe.info.backend_pid}/stat").exists():
                ctx.log("lease renewal: the server is not on this host; skipped")
                return
        started = time.monotonic()
        rows, duties = measure(url, sizes, renewals=renewals)
    for r in rows:
        ctx.log(
            f"lease renewal {r['leases']} {r['statistics']} {r['arm']}: "
            f"{r['cpu_ms_per_round_p50']} ms CPU per round, {r['core_pct_at_10s']}% of a core"
        )
    recorder = ctx.recorder(NAME)
    recorder.params(
        {
            "slots_per_worker": SLOTS,
            "rounds": ROUNDS,
            "renewals_per_measurement": renewals,
            "heartbeat_seconds": HEARTBEAT_SECONDS,
            "seconds": round(time.monotonic() - started, 1),
        }
    )
    recorder.table(NAME, rows)
    recorder.table(f"{NAME}_passes", duties)
