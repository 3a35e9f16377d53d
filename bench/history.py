"""Scenario 3 (seed 000 + DESIGN data model): does history slow the claim?

Part 1, history: EXPLAIN (ANALYZE, BUFFERS) of leaseq's claim (the ``job_claim`` statement,
and the equivalent bare ``SELECT ... FOR UPDATE SKIP LOCKED``) with 500 pending jobs over 0
and then N finished rows, with and without the partial claim index; table and index sizes.

Part 2, churn: N jobs driven through leaseq's own lifecycle (enqueue_many, claim, complete)
with autovacuum at the server's defaults, in two databases: ``leaseq`` (the migration's
per-table autovacuum settings) and ``control`` (those settings RESET). The claim's cost is
sampled before, during and after; then a 20,000-job backlog is drained and the claim latency
at its start is compared with its end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import scratch_database
from bench.explain import CALLS, function_plans
from bench.gang import Signals, run_gang
from bench.stats import ms, percentile
from leaseq.core._store import statements
from leaseq.runtime.claims import ClaimPlanner

NAME = "history"
QUEUE = "bench"
BACKLOG = 500
CLAIM_PARAMS = {
    "queues": [QUEUE],
    "owner": "explain",
    "limit": 1,
    "lease_seconds": 30.0,
    "claim_id": None,
    "claim_secret": b"s" * 32,
    "job_types": None,  # every type (a worker passes the types its registry serves)
    "now": None,
}
# The claim's inner query on its own, as the article measured it.
SELECT_CLAIM = b"""
SELECT id FROM leaseq.jobs
 WHERE status = 'pending' AND queue = %(queue)s AND available_at <= now()
 ORDER BY priority, available_at, id
 LIMIT 1
   FOR UPDATE SKIP LOCKED
"""
HISTORY = """
INSERT INTO leaseq.jobs (queue, job_type, status, attempt_count, lease_token, lease_owner,
                         created_at, available_at, started_at, finished_at, result)
SELECT %(queue)s, 'history', 'succeeded', 1, 1, 'w1', t.at, t.at, t.at, t.at + interval '1 s',
       '{}'::jsonb
  FROM generate_series(1, %(rows)s), (SELECT now() - interval '1 day' AS at) t
"""
# The settings leaseq's migration puts on leaseq.jobs; the control arm resets them.
TABLE_AUTOVACUUM = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_insert_threshold",
    "autovacuum_analyze_scale_factor",
    "autovacuum_analyze_threshold",
    "autovacuum_vacuum_cost_delay",
)
TABLE_STATE = """
SELECT s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count,
       pg_relation_size('leaseq.jobs') AS table_bytes,
       pg_relation_size('leaseq.jobs_claim_idx') AS claim_index_bytes,
       pg_sequence_last_value('leaseq.jobs_id_seq') AS enqueued
  FROM pg_stat_user_tables s
 WHERE s.relid = 'leaseq.jobs'::regclass
"""


def _scans(node: dict[str, Any]) -> Iterator[str]:
    if node.get("Relation Name") == "jobs" and "Scan" in node["Node Type"]:
        index = node.get("Index Name")
        yield f"{node['Node Type']} using {index}" if index else node["Node Type"]
    for child in node.get("Plans", []):
        yield from _scans(child)


def explain(
    conn: psycopg.Connection[Any], query: bytes, params: dict[str, Any], repeats: int = 5
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) ``query`` ``repeats`` times, each rolled back: the median
    execution time, and the buffers and scans of the last (warm) run."""
    times: list[float] = []
    plan: dict[str, Any] = {}
    for _ in range(repeats):
        with conn.transaction(force_rollback=True):
            row = conn.execute(
                b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params
            ).fetchone()
        plan = row[0][0] if row else {}
        times.append(float(plan["Execution Time"]))
    top = plan["Plan"]
    if CALLS.search(query):
        # A call of one of leaseq's functions: its own statement's plan, read as it runs.
        with conn.transaction(force_rollback=True):
            [top] = function_plans(conn, query, params, analyze=True)
    return {
        "execution_ms": round(percentile(times, 50), 3),
        "buffers": int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)),
        "buffers_read": int(top.get("Shared Read Blocks", 0)),
        "planning_ms": round(float(plan["Planning Time"]), 3),
        "scans": "; ".join(_scans(top)),
    }


def _claim_costs(conn: psycopg.Connection[Any], repeats: int = 5) -> dict[str, dict[str, Any]]:
    return {
        "job_claim": explain(conn, statements.load()["job_claim"].query, CLAIM_PARAMS, repeats),
        "select_skip_locked": explain(conn, SELECT_CLAIM, {"queue": QUEUE}, repeats),
    }


def _enqueue(url: str, jobs: int) -> None:
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        for start in range(0, jobs, 1000):
            count = min(1000, jobs - start)
            queue.enqueue_many(leaseq.JobSpec(QUEUE, "churn") for _ in range(count))


def _sizes(conn: psycopg.Connection[Any], condition: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT c.relname, c.relkind::text, pg_relation_size(c.oid)"
        "  FROM pg_class c"
        " WHERE c.oid = 'leaseq.jobs'::regclass"
        "    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'leaseq.jobs'::regclass)"
        " ORDER BY 3 DESC"
    ).fetchall()
    return [
        {
            "condition": condition,
            "relation": name,
            "kind": "table" if kind == "r" else "index",
            "bytes": size,
        }
        for name, kind, size in rows
    ]


def history_explain(url: str, finished: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Part 1: the claim over 0 and ``finished`` finished rows, with and without its index."""
    plans: list[dict[str, Any]] = []
    sizes: list[dict[str, Any]] = []
    _enqueue(url, BACKLOG)
    with psycopg.connect(url, autocommit=True) as conn:
        definition = conn.execute(
            "SELECT pg_get_indexdef('leaseq.jobs_claim_idx'::regclass)"
        ).fetchone()
        assert definition is not None
        for history in (0, finished):
            if history:
                conn.execute(HISTORY, {"queue": QUEUE, "rows": history})
            conn.execute("VACUUM ANALYZE leaseq.jobs")
            condition = f"{BACKLOG} pending + {history} finished"
            sizes.extend(_sizes(conn, condition))
            if history:
                # What a full (non-partial) index on the same columns would weigh.
                conn.execute(
                    "CREATE INDEX bench_full_claim_idx ON leaseq.jobs"
                    " (queue, priority, available_at, id)"
                )
                sizes.extend(
                    r for r in _sizes(conn, condition) if r["relation"] == "bench_full_claim_idx"
                )
                conn.execute("DROP INDEX leaseq.bench_full_claim_idx")
            for indexed in (True, False):
                if not indexed:
                    conn.execute("DROP INDEX leaseq.jobs_claim_idx")
                    conn.execute("ANALYZE leaseq.jobs")
                for statement, cost in _claim_costs(conn).items():
                    plans.append(
                        {
                            "finished_rows": history,
                            "pending": BACKLOG,
                            "partial_index": indexed,
                            "statement": statement,
                            **cost,
                        }
                    )
            conn.execute(definition[0])
            conn.execute("ANALYZE leaseq.jobs")
    return plans, sizes


@dataclass(frozen=True)
class ChurnArgs:
    url: str
    owner: str
    jobs: int
    batch: int


def churn_worker(args: ChurnArgs, signals: Signals) -> int:
    """Enqueue ``batch`` jobs, claim up to ``batch``, complete each; until ``jobs`` enqueued."""
    completed = 0
    with leaseq.connect(args.url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        signals.ready()
        enqueued = 0
        while enqueued < args.jobs:
            count = min(args.batch, args.jobs - enqueued)
            queue.enqueue_many(leaseq.JobSpec(QUEUE, "churn") for _ in range(count))
            enqueued += count
            for job in queue.claim([QUEUE], args.owner, limit=args.batch, plan=plan):
                queue.complete(job.lease)
                completed += 1
    return completed


@dataclass(frozen=True)
class DrainArgs:
    url: str
    owner: str


def drain_worker(args: DrainArgs, signals: Signals) -> list[tuple[float, float]]:
    """Claim one job at a time and complete it until none is left; (started at, latency)."""
    claims: list[tuple[float, float]] = []
    with leaseq.connect(args.url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        signals.ready()
        while True:
            started, t0 = time.time(), time.perf_counter()
            jobs = queue.claim([QUEUE], args.owner, plan=plan)
            if not jobs:
                return claims
            claims.append((started, time.perf_counter() - t0))
            queue.complete(jobs[0].lease)


class ChurnSampler(threading.Thread):
    """Samples the claim's cost and the table's vacuum state every ``every`` seconds."""

    def __init__(self, url: str, arm: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.arm, self.every = url, arm, every
        self.phase = "fresh"
        self.samples: list[dict[str, Any]] = []
        self.halt = threading.Event()
        self.t0 = time.perf_counter()

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        state = conn.execute(TABLE_STATE).fetchone()
        cost = explain(conn, statements.load()["job_claim"].query, CLAIM_PARAMS, repeats=3)
        assert state is not None
        self.samples.append(
            {
                "arm": self.arm,
                "phase": self.phase,
                "t": round(time.perf_counter() - self.t0, 2),
                "enqueued": state[6] or 0,
                "claim_ms": cost["execution_ms"],
                "claim_buffers": cost["buffers"],
                "scans": cost["scans"],
                "n_live_tup": state[0],
                "n_dead_tup": state[1],
                "autovacuum_count": state[2],
                "autoanalyze_count": state[3],
                "table_bytes": state[4],
                "claim_index_bytes": state[5],
            }
        )

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.halt.wait(self.every):
                self.sample(conn)


@contextmanager
def _sampling(url: str, arm: str, every: float) -> Iterator[ChurnSampler]:
    sampler = ChurnSampler(url, arm, every)
    with psycopg.connect(url, autocommit=True) as conn:
        sampler.sample(conn)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.halt.set()
        sampler.join()


class VacuumLoop(threading.Thread):
    """What the operator's reaper does after each pass (every ``every`` seconds): call
    :meth:`leaseq.Queue.vacuum`, which vacuums leaseq.jobs once it holds ``threshold`` dead
    row versions, instead of waiting up to autovacuum_naptime for autovacuum."""

    def __init__(self, url: str, every: float, threshold: int = 2000) -> None:
        super().__init__(daemon=True)
        self.url, self.every, self.threshold = url, every, threshold
        self.halt = threading.Event()
        self.vacuums = 0

    def run(self) -> None:
        with leaseq.connect(self.url, action="bench") as conn:
            queue = leaseq.Queue(conn)
            while not self.halt.wait(self.every):
                if queue.vacuum(min_dead_tuples=self.threshold) is not None:
                    self.vacuums += 1


@contextmanager
def _vacuuming(url: str, every: float | None) -> Iterator[VacuumLoop | None]:
    if every is None:
        yield None
        return
    loop = VacuumLoop(url, every)
    loop.start()
    try:
        yield loop
    finally:
        loop.halt.set()
        loop.join()


# Arms: the migration's settings, the control without them, and the reaper's vacuum on top.
ARMS: dict[str, float | None] = {"leaseq": None, "control": None, "leaseq+reaper_vacuum_5s": 5.0}


def churn(
    ctx: Context, arm: str, jobs: int, every: float, wait_after: float, drain: int
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Part 2 for one arm: summary row, cost samples, drain latency buckets."""
    processes, batch = 3, 100
    label = arm.replace("+", "_")
    with scratch_database(ctx.server_url, f"churn_{label}") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            if arm == "control":
                conn.execute(f"ALTER TABLE leaseq.jobs RESET ({', '.join(TABLE_AUTOVACUUM)})")
            options = conn.execute(
                "SELECT coalesce(array_to_string(reloptions, ' '), '') FROM pg_class"
                " WHERE oid = 'leaseq.jobs'::regclass"
            ).fetchone()
        _enqueue(url, BACKLOG)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE leaseq.jobs")
        share = [jobs // processes + (1 if i < jobs % processes else 0) for i in range(processes)]
        with _vacuuming(url, ARMS[arm]) as vacuum, _sampling(url, arm, every) as sampler:
            sampler.phase = "during"
            run = run_gang(
                churn_worker,
                [ChurnArgs(url, f"c{i + 1}", n, batch) for i, n in enumerate(share)],
                timeout=3600.0,
            )
            sampler.phase = "after"
            time.sleep(wait_after)
        samples = sampler.samples
        with psycopg.connect(url, autocommit=True) as conn:
            sampler.phase = "end"
            sampler.sample(conn)
        _enqueue(url, drain)
        claims = sorted(
            c
            for r in run_gang(drain_worker, [DrainArgs(url, f"d{i + 1}") for i in range(4)]).results
            for c in r
        )
    fresh = samples[0]
    after = next((s for s in samples if s["phase"] == "after"), samples[-1])
    worst = max(samples, key=lambda s: s["claim_buffers"])
    completed = sum(run.results)
    summary = {
        "arm": arm,
        "reloptions": options[0] if options else "",
        "jobs": completed,
        "seconds": round(run.seconds, 1),
        "jobs_per_second": round(completed / run.seconds, 1),
        "fresh_claim_ms": fresh["claim_ms"],
        "fresh_claim_buffers": fresh["claim_buffers"],
        "after_claim_ms": after["claim_ms"],
        "after_claim_buffers": after["claim_buffers"],
        "worst_claim_ms": worst["claim_ms"],
        "worst_claim_buffers": worst["claim_buffers"],
        "end_claim_ms": samples[-1]["claim_ms"],
        "end_claim_buffers": samples[-1]["claim_buffers"],
        "autovacuum_runs": samples[-1]["autovacuum_count"],
        "explicit_vacuums": vacuum.vacuums if vacuum else 0,
    }
    buckets = 20
    size = max(len(claims) // buckets, 1)
    drained = [
        {
            "arm": arm,
            "bucket": b,
            "first_claim": b * size + 1,
            "claims": len(part),
            "claim_p50_ms": ms(percentile([c[1] for c in part], 50)),
            "claim_p99_ms": ms(percentile([c[1] for c in part], 99)),
        }
        for b in range(buckets)
        if (part := claims[b * size : (b + 1) * size])
    ]
    return summary, samples, drained


def run(ctx: Context) -> None:
    if ctx.quick:
        finished, jobs, every, wait_after, drain = 100_000, 20_000, 1.0, 0.0, 2_000
    else:
        finished, jobs, every, wait_after, drain = 500_000, 500_000, 5.0, 65.0, 20_000
    recorder = ctx.recorder(NAME)
    with scratch_database(ctx.server_url, "history") as url:
        plans, sizes = history_explain(url, finished)
    for p in plans:
        ctx.log(
            f"history {p['finished_rows']} finished, index {p['partial_index']}, "
            f"{p['statement']}: {p['buffers']} buffers, {p['execution_ms']} ms ({p['scans']})"
        )
    recorder.table(f"{NAME}_explain", plans)
    recorder.table(f"{NAME}_sizes", sizes)
    summaries, samples, drains = [], [], []
    for arm in ctx.churn_arms:
        summary, arm_samples, drained = churn(ctx, arm, jobs, every, wait_after, drain)
        ctx.log(f"churn {arm}: {summary}")
        summaries.append(summary)
        samples.extend(arm_samples)
        drains.extend(drained)
    recorder.params(
        {
            "backlog": BACKLOG,
            "finished_rows": finished,
            "churn_jobs": jobs,
            "sample_every_s": every,
            "wait_after_s": wait_after,
            "drain_jobs": drain,
            "churn_processes": 3,
            "churn_batch": 100,
            "drain_processes": 4,
        }
    )
    recorder.table(f"{NAME}_churn", summaries)
    recorder.table(f"{NAME}_churn_samples", samples)
    recorder.table(f"{NAME}_drain", drains)
