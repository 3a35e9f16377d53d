"""Flow control (issue 20): what per-key limits cost and keep.

* ``flow_claim``: claim + complete throughput of keyed jobs (no limit, and a limit per key)
  against keyless jobs, with 1, 1,000 and 100,000 keys (quick: 1, 100, 1,000), 4 claimer
  threads on their own connections, each claim of one job followed by its completion: what a
  job costs end to end, the release included. Each keyed run is paired with a keyless run
  beside it that enqueues as many jobs, and its ratio is against that run. Two rounds, in
  alternating order (quick: one). The target is a ratio of at least 0.8. Each row also has
  the client's and the server's CPU per job, and the keyless run's CPU per job over this
  one's (``cpu_vs_keyless``): the ratio a CPU-bound machine would show, steadier than jobs/s.
  Every drain starts with its tables vacuumed and runs the operator's vacuum duty beside
  its claimers, keyed or keyless, as a deployment does.
* ``flow_statements``: the same claim and completion on one connection, nothing else
  running, the commit's flush off (it is the same for both sides and is most of a lone
  statement's wall time here): the median wall time of each, keyless, keyed and limited.
  What a keyed job costs by itself, apart from contention between claimers. Two rounds in
  alternating order (quick: one).
* ``flow_hot_key``: one hot key with a limit of 40 and 4 processes x 10 claimer threads,
  each job "working" ``job_seconds`` (a sleep): jobs/s against what the limit allows
  (40 / job_seconds), and the most jobs running at once (from the attempt history).
* ``flow_explain``: the plans of the keyed claims that keep limits (EXPLAIN ANALYZE, generic
  plan) with a saturated key holding a large backlog and a free key: the saturated key's
  pending rows are never read (its job probe is never executed).
"""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import reset_flow, scratch_database
from bench.explain import function_plans, plan_lines
from bench.gang import server_cpu_meter, wait_reaped
from leaseq.runtime.claims import ClaimPlanner
from leaseq_operator.config import REAP_INTERVAL, VACUUM_DEAD_TUPLES

NAME = "flow"
QUEUE = "bench"
#: Seconds one drain may take before its claimers stop waiting for each other.
DRAIN_TIMEOUT = 600.0


def _enqueue(url: str, jobs: int, keys: int | None, limit: int | None) -> None:
    with leaseq.connect(url, action="bench") as conn:
        if keys is not None and limit is not None:
            leaseq.FlowControl(conn).set_limit(QUEUE, "k*", max_running=limit)
        q = leaseq.Queue(conn)
        batch = 5000
        for start in range(0, jobs, batch):
            q.enqueue_many(
                leaseq.JobSpec(QUEUE, "t", None, key=None if keys is None else f"k{n % keys}")
                for n in range(start, min(jobs, start + batch))
            )
        # Every table a drain reads starts vacuumed: a new key's row is written twice at its
        # enqueue (inserted, then its limit applied), and autovacuum cleaning that up during
        # a keyed drain only would charge the keyed side for the enqueue.
        conn.execute("VACUUM ANALYZE leaseq.jobs, leaseq.flow_keys, leaseq.flow_slots")
        backend = conn.info.backend_pid
    # Its backend's CPU (the enqueue's, seconds at 100,000 jobs) must not fall into the drain.
    wait_reaped(backend)


def _drain(url: str, threads: int, jobs: int, server: Callable[[], float] | None) -> Drained:
    """Claim and complete ``jobs`` jobs with ``threads`` claimers: jobs per second, and the
    CPU per job of this process and of the server (``server``: its meter, None when its
    processes are not visible here), read while the claimers' backends still live (an exited
    backend's time reaches its postmaster only once it is reaped). A claimer that fails
    breaks the wait for the others (BrokenBarrierError) instead of hanging it."""
    done = [0]
    lock = threading.Lock()
    drained = threading.Barrier(threads + 1, timeout=DRAIN_TIMEOUT)
    measured = threading.Event()

    def claimer(n: int) -> None:
        try:
            with leaseq.connect(url, action="bench") as conn:
                leaseq.Queue.tune_worker_session(conn)
                q = leaseq.Queue(conn)
                plan = ClaimPlanner()  # claims as a worker does
                while True:
                    with lock:
                        if done[0] >= jobs:
                            break
                    got = q.claim([QUEUE], f"w{n}", limit=1, plan=plan)
                    if not got:
                        continue
                    q.complete(got[0].lease, None)
                    with lock:
                        done[0] += 1
                drained.wait()
                measured.wait()
        except BaseException:
            drained.abort()
            raise

    def leader() -> None:
        # The operator's vacuum duty with its defaults, as a deployment runs it: keyed or
        # keyless, a drain's claims walk the dead entries that finished jobs and idle keys
        # leave until VACUUM removes them.
        with leaseq.connect(url, action="bench") as conn:
            q = leaseq.Queue(conn)
            while not measured.wait(REAP_INTERVAL.default):
                q.vacuum(min_dead_tuples=VACUUM_DEAD_TUPLES.default)

    pool = [threading.Thread(target=claimer, args=(n,)) for n in range(threads)]
    pool.append(threading.Thread(target=leader))
    client0, server0 = time.process_time(), server() if server else 0.0
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    try:
        drained.wait()
        seconds = time.perf_counter() - t0
        client = (time.process_time() - client0) / jobs * 1e3
        db = (server() - server0) / jobs * 1e3 if server else None
    finally:
        measured.set()
    for t in pool:
        t.join()
    return Drained(jobs / seconds, client, db)


def claim_rows(
    url: str, key_counts: tuple[int, ...], jobs: int, rounds: int, ctx: Context
) -> list[Any]:
    """Every keyed configuration once per round, each paired with a keyless run of its own
    right beside it (before it in odd rounds, after it in even ones) that enqueues as many
    jobs, the configurations in alternating order; a row's ratio is against its own pair's
    keyless run, so a drift of the machine's speed during a round (up to 1.7x here) reaches
    both sides of a ratio alike. The keyless row of a round shows the median of its pair
    runs (of either size: its enqueued column is empty)."""
    configs: list[tuple[int, int | None]] = [(k, lim) for k in key_counts for lim in (None, 4)]

    server = server_cpu_meter(url)

    def measure(keys: int | None, limit: int | None, rnd: int, total: int) -> Drained:
        reset_flow(url)
        _enqueue(url, total, keys, limit)
        run = _drain(url, 4, jobs, server)
        ctx.log(f"flow claim round {rnd}: keys={keys} limit={limit}: {run.rate:.0f} jobs/s")
        return run

    rows = []
    for rnd in range(1, rounds + 1):
        order = configs if rnd % 2 else configs[::-1]
        pairs: dict[tuple[int, int | None], tuple[Drained, Drained]] = {}
        for keys, limit in order:
            # At least one job per key, all enqueued first; the keyless pair enqueues as many
            # (and drains as many), so both sides' drains walk tables of the same size.
            total = max(jobs, keys)
            if rnd % 2:
                base = measure(None, None, rnd, total)
                run = measure(keys, limit, rnd, total)
            else:
                run = measure(keys, limit, rnd, total)
                base = measure(None, None, rnd, total)
            pairs[(keys, limit)] = (run, base)
        keyless = Drained.median([base for _, base in pairs.values()])
        rows.append(_claim_row(rnd, 0, None, None, jobs, keyless, keyless))
        rows += [
            _claim_row(rnd, keys, limit, max(jobs, keys), jobs, *pairs[(keys, limit)])
            for keys, limit in configs
        ]
    return rows


STATEMENT_CONFIGS: tuple[tuple[int | None, int | None], ...] = (
    (None, None),
    (1, None),
    (1, 4),
    (1000, None),
    (1000, 4),
)


def _lone_statements(
    url: str, jobs: int, keys: int | None, limit: int | None
) -> tuple[float, float]:
    """``jobs`` claims of one job, each followed by its completion, on one connection with
    the commit's flush off: the median wall time of a claim and of a completion (µs), the
    first tenth left out (the session's plans being prepared)."""
    reset_flow(url)
    _enqueue(url, max(jobs, keys or 0), keys, limit)
    claims, completes = [], []
    with leaseq.connect(url, action="bench") as conn:
        leaseq.Queue.tune_worker_session(conn)
        conn.execute("SET synchronous_commit = off")
        q = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        for _ in range(jobs):
            t0 = time.perf_counter()
            got = q.claim([QUEUE], "w", limit=1, plan=plan)
            t1 = time.perf_counter()
            q.complete(got[0].lease, None)
            claims.append(t1 - t0)
            completes.append(time.perf_counter() - t1)
    warm = jobs // 10
    return statistics.median(claims[warm:]) * 1e6, statistics.median(completes[warm:]) * 1e6


def statement_rows(url: str, jobs: int, rounds: int, ctx: Context) -> list[dict[str, Any]]:
    """Each configuration once per round (in reverse order in even rounds), measured by
    :func:`_lone_statements`; a row's ratio is against its round's keyless run."""
    rows = []
    for rnd in range(1, rounds + 1):
        measured: dict[tuple[int | None, int | None], tuple[float, float]] = {}
        for keys, limit in STATEMENT_CONFIGS if rnd % 2 else STATEMENT_CONFIGS[::-1]:
            claim_us, complete_us = measured[(keys, limit)] = _lone_statements(
                url, jobs, keys, limit
            )
            ctx.log(
                f"flow statements round {rnd}: keys={keys} limit={limit}:"
                f" claim {claim_us:.0f} us, complete {complete_us:.0f} us"
            )
        base = sum(measured[(None, None)])
        for keys, limit in STATEMENT_CONFIGS:
            claim_us, complete_us = measured[(keys, limit)]
            rows.append({
                "round": rnd, "keys": keys or 0, "limit_per_key": limit or "",
                "claim_us": round(claim_us), "complete_us": round(complete_us),
                "vs_keyless": round(base / (claim_us + complete_us), 2),
            })  # fmt: skip
    return rows


@dataclass(frozen=True)
class Drained:
    """One drain: jobs per second, and the client's and the server's CPU per job (ms; the
    server's None when its processes are not visible here)."""

    rate: float
    client_ms: float
    server_ms: float | None

    def cpu_ms(self) -> float | None:
        return None if self.server_ms is None else self.client_ms + self.server_ms

    @staticmethod
    def median(runs: list[Drained]) -> Drained:
        """Each figure's median over ``runs`` (the server's None unless every run has it)."""
        servers = [r.server_ms for r in runs if r.server_ms is not None]
        return Drained(
            statistics.median(r.rate for r in runs),
            statistics.median(r.client_ms for r in runs),
            statistics.median(servers) if len(servers) == len(runs) else None,
        )


def _claim_row(
    rnd: int,
    keys: int,
    limit: int | None,
    enqueued: int | None,
    drained: int,
    run: Drained,
    base: Drained,
) -> dict[str, Any]:
    """A configuration's row: its throughput against its pair's keyless run, and its CPU per
    job against the keyless run's (what the throughput ratio would be if CPU alone bound it;
    CPU per job is far steadier than jobs/s on a noisy machine)."""
    cpu, base_cpu = run.cpu_ms(), base.cpu_ms()
    return {
        "round": rnd,
        "keys": keys,
        "limit_per_key": limit or "",
        "enqueued": "" if enqueued is None else enqueued,
        "drained": drained,
        "jobs_per_s": round(run.rate, 1),
        "keyless_jobs_per_s": round(base.rate, 1),
        "vs_keyless": round(run.rate / base.rate, 3),
        "client_ms_per_job": round(run.client_ms, 3),
        "server_ms_per_job": "" if run.server_ms is None else round(run.server_ms, 3),
        "cpu_vs_keyless": "" if cpu is None or base_cpu is None else round(base_cpu / cpu, 3),
    }


def _hot_process(url: str, threads: int, job_seconds: float, owner: str) -> None:
    def claimer(n: int) -> None:
        with leaseq.connect(url, action="bench") as conn:
            leaseq.Queue.tune_worker_session(conn)
            q = leaseq.Queue(conn)
            plan = ClaimPlanner()  # claims as a worker does
            idle = 0
            while idle < 40:
                got = q.claim([QUEUE], f"{owner}-{n}", limit=1, plan=plan)
                if not got:
                    idle += 1
                    time.sleep(0.02)  # a worker's idle wait (no NOTIFY listener here)
                    continue
                idle = 0
                time.sleep(job_seconds)
                q.complete(got[0].lease, None)

    pool = [threading.Thread(target=claimer, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def hot_key_row(url: str, jobs: int, job_seconds: float, ctx: Context) -> dict[str, Any]:
    limit, processes, threads = 40, 4, 10
    reset_flow(url)
    with leaseq.connect(url, action="bench") as conn:
        leaseq.FlowControl(conn).set_limit(QUEUE, "hot", max_running=limit)
        leaseq.Queue(conn).enqueue_many(leaseq.JobSpec(QUEUE, "t", key="hot") for _ in range(jobs))
    mp = multiprocessing.get_context("spawn")
    procs = [
        mp.Process(target=_hot_process, args=(url, threads, job_seconds, f"p{p}"))
        for p in range(processes)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(ended_at) - min(started_at))::float8"
            " FROM leaseq.job_attempts WHERE outcome = 'succeeded'"
        ).fetchone()
        assert row is not None
        spans = conn.execute(
            "SELECT started_at, ended_at FROM leaseq.job_attempts WHERE outcome = 'succeeded'"
        ).fetchall()
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    done, seconds = int(row[0]), float(row[1])  # type: ignore[call-overload, arg-type]
    rate = done / seconds
    allowed = limit / job_seconds
    ctx.log(f"flow hot key: {rate:.0f} jobs/s of {allowed:.0f} allowed; peak {peak}")
    return {
        "limit": limit,
        "workers": f"{processes}x{threads}",
        "job_seconds": job_seconds,
        "jobs": done,
        "jobs_per_s": round(rate, 1),
        "allowed_jobs_per_s": round(allowed, 1),
        "share_of_allowed": round(rate / allowed, 3),
        "peak_running": peak,
    }


def explain_rows(url: str, backlog: int) -> list[dict[str, Any]]:
    """The generic plans of the keyed claims that keep limits (job_claim_keyed_slots, which
    a worker uses while its queues have no rate, and job_claim_keyed) with a saturated key
    (``backlog`` pending, walked first) and a free key: the saturated key's slot probe finds
    nothing, so its job probe never runs (the jobs index scan runs once, for the free key)."""
    reset_flow(url)
    with leaseq.connect(url, action="bench") as conn:
        flow = leaseq.FlowControl(conn)
        flow.set_limit(QUEUE, "a-saturated", max_running=1)
        q = leaseq.Queue(conn)
        q.enqueue_many(leaseq.JobSpec(QUEUE, "t", key="a-saturated") for _ in range(backlog))
        # Take the saturated key's only unit, then give the free key work.
        assert q.claim([QUEUE], "holder", limit=1)
        q.enqueue_many(leaseq.JobSpec(QUEUE, "t", key="b-free") for _ in range(10))
        conn.execute("VACUUM ANALYZE leaseq.jobs")
        from leaseq.core._store import statements

        params = {
            "queues": [QUEUE],
            "job_types": None,
            "owner": "explainer",
            "limit": 4,
            "lease_seconds": 30.0,
            "claim_id": "00000000-0000-0000-0000-000000000000",
            "claim_secret": b"s" * 32,
            "now": None,
        }
        conn.execute("SET plan_cache_mode = force_generic_plan")
        rows = []
        for name in ("job_claim_keyed_slots", "job_claim_keyed"):
            with conn.transaction(force_rollback=True):
                [plan] = function_plans(conn, statements.load()[name].query, params, analyze=True)
            rows += [
                {"statement": name, "line": n, "plan": line}
                for n, line in enumerate(plan_lines(plan))
            ]
    return rows


def run(ctx: Context) -> None:
    key_counts = (1, 1000, 100_000) if not ctx.quick else (1, 100, 1000)
    jobs = 2000 if ctx.quick else 10_000
    hot_jobs, job_seconds = (240, 0.4) if ctx.quick else (2000, 0.4)
    backlog = 2000 if ctx.quick else 100_000
    rounds = 1 if ctx.quick else 2
    statement_jobs = 500 if ctx.quick else 3000
    with scratch_database(ctx.server_url, NAME) as url:
        claims = claim_rows(url, key_counts, jobs, rounds, ctx)
        statements = statement_rows(url, statement_jobs, rounds, ctx)
        hot = hot_key_row(url, hot_jobs, job_seconds, ctx)
        plan = explain_rows(url, backlog)
    recorder = ctx.recorder(NAME)
    recorder.params(
        {"keys": key_counts, "jobs": jobs, "claimers": 4, "rounds": rounds,
         "statement_jobs": statement_jobs, "hot_jobs": hot_jobs,
         "backlog_of_saturated_key": backlog}
    )  # fmt: skip
    recorder.table("flow_claim", claims)
    recorder.table("flow_statements", statements)
    recorder.table("flow_hot_key", [hot])
    recorder.table("flow_explain", plan)
    ctx.log("flow explain:\n" + "\n".join(r["plan"] for r in plan))
