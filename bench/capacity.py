"""Scenario (issue 52): what leaseq's own workload costs one PostgreSQL primary, per unit.

Every row is one part of the workload at one size, with what the server spent on it: CPU
(``server_cpu_ms_per_unit``) and WAL (``wal_bytes_per_unit``, the difference of
``pg_current_wal_lsn()`` over the interval, so everything the server wrote meanwhile), and the
client connections to the database the server held (``server_connections``, the most seen).
Unless a row says otherwise the CPU is every PostgreSQL process of the server (postmaster,
live and reaped children: the backends, autovacuum, WAL writer, checkpointer), from their
/proc/<pid>/stat utime + stime, so the server must run on this host.

* ``idle``: the server with nothing connected but the meter (its baseline per second).
* ``enqueue``: producers' inserts, 1,000 jobs per ``enqueue_many`` and one job per ``enqueue``.
* ``jobs``: a backlog drained by W processes, each claiming up to 16 jobs per statement (as
  the runtime fills its free slots) and completing them with one ``complete_many``, W = 1 to
  8 (and 16 with PgBouncer), as fast as the machine allows: ``units_per_s`` is where it
  saturates here, ``server_cores_busy`` the server's share of the two cores at that point
  (the clients use the rest).
* ``keys``: the same drain of keyed jobs, without and with a limit of 4 per key; and
  ``table_bytes_per_unit``, the size of the flow-key tables per key after the enqueue.
* ``leases``: renewing N running leases once (``heartbeat_many``, 8 leases per worker, as
  :mod:`bench.lease_renewal`; CPU of the serving backend only), per renewal;
  ``reaper``: one reaper pass with those N leases held, per pass.
* ``idle workers``: K real ``leaseq worker`` processes (``--concurrency 16``, polling every
  1 s, LISTEN on), no job; per worker-second. Behind PgBouncer (transaction pooling, a pool
  of 4 server connections; ``--listen false --prepared-statements false`` as the PgBouncer
  guide says): the same, with the server connections it needed.
* ``pgbouncer jobs``: the ``jobs`` drain through that PgBouncer; ``pooler_cpu_ms_per_unit``
  is PgBouncer's own CPU (it is another process to place and size).
* ``connection memory``: C idle connections opened and used once: each backend's private
  memory (Private_Clean + Private_Dirty of /proc/<pid>/smaps_rollup), per connection.
* ``schedules``: N schedules firing every minute: one scheduler tick fires each once
  (per fired slot), then an idle tick with nothing due (per pass, every 5 s by default).
* ``history``: the history mover moving N finished jobs into the partitioned history
  (batches of 5,000, the mover's largest), per moved job.

Two rounds in a full run (one quick): the machine is shared, and the two say how noisy it was.
A full run is ``python -m bench --only capacity``; ``python -m bench --quick`` runs it at a
smoke size only. :mod:`bench.capacity_tables` renders the result for the report and the docs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg

import leaseq
from bench import capacity_tables, lease_renewal
from bench.context import Context
from bench.env import reset_flow, scratch_database
from bench.gang import Signals, process_cpu_seconds, run_gang, server_cpu_meter, wait_reaped
from bench.runtime import running_workers
from bench.stats import percentile
from leaseq.core.db import UNPREPARED
from leaseq.core.history import History
from leaseq.runtime.claims import ClaimPlanner

NAME = capacity_tables.NAME
QUEUE = "bench"
BATCH = 16
POOL = 4
ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")

#: Idle scheduler passes per measurement.
IDLE_TICKS = 20


@dataclass(frozen=True)
class Sizes:
    """How big one round is."""

    rounds: int
    jobs: int
    workers: tuple[int, ...]
    bouncer_workers: tuple[int, ...]
    keys: tuple[tuple[int, int | None], ...]
    leases: tuple[int, ...]
    idle_workers: tuple[int, ...]
    idle_seconds: float
    connections: int
    schedules: tuple[int, ...]
    history: int


QUICK = Sizes(1, 400, (2,), (2,), ((20, 4),), (64,), (1,), 2.0, 4, (10,), 400)
FULL = Sizes(
    rounds=2,
    jobs=20_000,
    workers=(1, 2, 4, 8),
    bouncer_workers=(4, 16),
    keys=((1000, None), (1000, 4), (10_000, 4)),
    leases=(1000, 10_000, 50_000),
    idle_workers=(1, 4, 8),
    idle_seconds=15.0,
    connections=50,
    schedules=(100, 1000, 10_000),
    history=10_000,
)


@dataclass(frozen=True)
class Usage:
    """What the server spent over one interval."""

    seconds: float
    server_cpu: float
    wal_bytes: int
    connections: int


class Server:
    """The server's CPU meter and a connection of its own to read the WAL position and the
    connections with (its own connection is not counted)."""

    def __init__(self, url: str) -> None:
        meter = server_cpu_meter(url)
        if meter is None:
            raise LookupError("the server's processes are not on this host")
        self.cpu = meter
        self.conn = psycopg.connect(url, autocommit=True)

    def lsn(self) -> str:
        return str(self._one("SELECT pg_current_wal_lsn()::text"))

    def wal_since(self, lsn: str) -> int:
        return int(self._one("SELECT pg_current_wal_lsn() - %s::pg_lsn", lsn))

    def connections(self) -> int:
        """Client connections to this database, apart from this one."""
        return int(
            self._one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        )

    def disconnect_others(self) -> None:
        """End every other client connection to this database (a pooler's idle ones)."""
        self._one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND backend_type = 'client backend'"
            " AND pid <> pg_backend_pid()"
        )

    def _one(self, query: str, *params: Any) -> Any:
        row = self.conn.execute(query, list(params) or None).fetchone()
        return row[0] if row else None

    def metered(self, action: Callable[[], T]) -> tuple[T, Usage]:
        """Run ``action`` and return what the server spent meanwhile."""
        lsn = self.lsn()
        cpu0, t0 = self.cpu(), time.perf_counter()
        result = action()
        seconds, cpu = time.perf_counter() - t0, self.cpu() - cpu0
        return result, Usage(seconds, cpu, self.wal_since(lsn), self.connections())

    def close(self) -> None:
        self.conn.close()


def row(part: str, setting: str, size: int, unit: str, units: int, use: Usage) -> dict[str, Any]:
    """One CSV row: ``units`` of ``unit`` done with ``size`` of the part present, costing ``use``.
    ``per_core_on_paper`` is units per second one server core would do at this CPU per unit
    (arithmetic, not measured)."""
    per = max(units, 1)
    return {
        "part": part,
        "setting": setting,
        "size": size,
        "unit": unit,
        "units": units,
        "seconds": round(use.seconds, 3),
        "units_per_s": round(units / use.seconds, 1) if use.seconds else "",
        "server_cpu_ms_per_unit": round(use.server_cpu * 1000 / per, 4),
        "wal_bytes_per_unit": round(use.wal_bytes / per),
        "server_cores_busy": round(use.server_cpu / use.seconds, 3) if use.seconds else "",
        "server_connections": use.connections,
        "per_core_on_paper": round(units / use.server_cpu) if use.server_cpu > 0 else "",
    }


# -- producers, drains, keys --------------------------------------------------------------


def _enqueue(url: str, jobs: int, keys: int | None = None) -> None:
    with leaseq.connect(url, action="bench") as conn:
        q = leaseq.Queue(conn)
        for start in range(0, jobs, 1000):
            q.enqueue_many(
                leaseq.JobSpec(QUEUE, "noop", None, key=None if keys is None else f"k{n % keys}")
                for n in range(start, min(jobs, start + 1000))
            )
        conn.execute("VACUUM ANALYZE leaseq.jobs, leaseq.flow_keys, leaseq.flow_slots")
        backend = conn.info.backend_pid
    # The enqueue's backend CPU must not fall into the drain measured next.
    wait_reaped(backend)


def _reset(url: str) -> None:
    reset_flow(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE leaseq.schedules, leaseq.schedule_slots, leaseq.workers, leaseq.job_history,"
            " leaseq.job_attempt_history, leaseq.job_ledger, leaseq.history_counts"
        )


def enqueue_rows(server: Server, url: str, jobs: int) -> list[dict[str, Any]]:
    """Producers: jobs enqueued 1,000 per statement, and one per statement."""
    _reset(url)
    _, many = server.metered(lambda: _enqueue_only(url, jobs, 1000))
    _, one = server.metered(lambda: _enqueue_only(url, jobs // 10, 1))
    return [
        row("enqueue", "enqueue_many, 1000 per call", jobs, "job", jobs, many),
        row("enqueue", "enqueue, one per call", jobs // 10, "job", jobs // 10, one),
    ]


def _enqueue_only(url: str, jobs: int, per_call: int) -> None:
    """Enqueue on a connection of its own, returning once its backend has exited and been
    reaped: an exiting backend's CPU is in neither its /proc entry nor its postmaster's
    until then (bench.gang.wait_reaped), and would be lost to the meter."""
    with leaseq.connect(url, action="bench") as conn:
        backend = conn.info.backend_pid
        q = leaseq.Queue(conn)
        if per_call == 1:
            for _ in range(jobs):
                q.enqueue(QUEUE, "noop")
        else:
            for start in range(0, jobs, per_call):
                q.enqueue_many(
                    leaseq.JobSpec(QUEUE, "noop") for _ in range(min(per_call, jobs - start))
                )
    wait_reaped(backend)


@dataclass(frozen=True)
class LoopArgs:
    url: str
    owner: str
    prepare: bool


def loop_worker(args: LoopArgs, signals: Signals) -> None:
    """Claim up to BATCH jobs per statement and complete them with one ``complete_many``
    (the runtime's statements), until told to stop; without ``prepare`` no server-side
    prepared statements (a PgBouncer before 1.21)."""
    options = {} if args.prepare else UNPREPARED
    with leaseq.connect(args.url, action="bench", **options) as conn:
        if args.prepare:
            leaseq.Queue.tune_worker_session(conn)
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        signals.ready()
        while not signals.stopping():
            jobs = queue.claim([QUEUE], args.owner, limit=BATCH, plan=plan)
            if jobs:
                queue.complete_many([job.lease for job in jobs])
            else:
                time.sleep(0.005)


def drain(
    server: Server, url: str, workers: int, *, via: str | None = None, pooler: int | None = None
) -> tuple[int, Usage, float]:
    """Drain the queue with ``workers`` loop processes (connecting to ``via``, default
    ``url``): jobs finished, the server's usage, and the CPU seconds of process ``pooler``."""
    most = [0]

    def done() -> bool:
        most[0] = max(most[0], server.connections())
        return not server._one(
            "SELECT EXISTS (SELECT 1 FROM leaseq.jobs WHERE status IN ('pending', 'running'))"
        )

    lsn = server.lsn()
    pooled0 = process_cpu_seconds(pooler) if pooler else 0.0
    run = run_gang(
        loop_worker,
        [LoopArgs(via or url, f"w{i + 1}", via is None) for i in range(workers)],
        until=done,
        server_cpu=server.cpu,
    )
    pooled = process_cpu_seconds(pooler) - pooled0 if pooler else 0.0
    finished = int(server._one("SELECT count(*) FROM leaseq.jobs WHERE status = 'succeeded'"))
    use = Usage(run.seconds, run.server_cpu or 0.0, server.wal_since(lsn), most[0])
    return finished, use, pooled


def job_rows(server: Server, url: str, sizes: Sizes) -> list[dict[str, Any]]:
    """The drain at each worker count; then keyed drains at W=4 (or the largest W)."""
    rows = []
    for workers in sizes.workers:
        _reset(url)
        _enqueue(url, sizes.jobs)
        finished, use, _ = drain(server, url, workers)
        rows.append(row("jobs", f"W={workers}, claim {BATCH}", workers, "job", finished, use))
    w = 4 if 4 in sizes.workers else max(sizes.workers)
    for keys, limit in sizes.keys:
        _reset(url)
        if limit is not None:
            with leaseq.connect(url, action="bench") as conn:
                leaseq.FlowControl(conn).set_limit(QUEUE, "k*", max_running=limit)
        jobs = max(sizes.jobs, keys)
        _enqueue(url, jobs, keys)
        table = int(
            server._one(
                "SELECT pg_total_relation_size('leaseq.flow_keys')"
                " + pg_total_relation_size('leaseq.flow_slots')"
            )
        )
        finished, use, _ = drain(server, url, w)
        setting = f"W={w}, {'no limit' if limit is None else f'limit {limit} per key'}"
        rows.append(
            {
                **row("keys", setting, keys, "job", finished, use),
                "table_bytes_per_unit": round(table / keys),
            }
        )
    return rows


# -- leases, the reaper -----------------------------------------------------------------


def lease_rows(url: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Renewals of N leases (the serving backend's CPU, as bench.lease_renewal measures it)
    and one reaper pass with them held."""
    rows = []
    for leases in sizes.leases:
        _reset(url)
        held = lease_renewal.hold(url, leases, fresh=True)
        cpu, wal = lease_renewal.rounds(url, held, "per_worker", max(leases, 2000))
        mid, written = percentile(cpu, 50), percentile(wal, 50)
        rows.append(
            {
                "part": "leases",
                "setting": "heartbeat_many, 8 leases per worker, one connection",
                "size": leases,
                "unit": "renewal",
                "units": leases,
                "seconds": round(mid, 4),
                # One backend renewing flat out: its rate if it had a core to itself.
                "units_per_s": round(leases / mid) if mid else "",
                "server_cpu_ms_per_unit": round(mid * 1000 / leases, 5),
                "wal_bytes_per_unit": round(written / leases),
                "server_connections": 1,
                "per_core_on_paper": round(leases / mid) if mid else "",
                "cpu_source": "serving backend",
            }
        )
        (duty,) = [d for d in lease_renewal.passes(url, leases, "fresh") if d["duty"] == "reap"]
        rows.append(
            {
                "part": "reaper",
                "setting": "one pass, none expired",
                "size": leases,
                "unit": "pass",
                "units": lease_renewal.PASSES,
                "server_cpu_ms_per_unit": duty["cpu_ms_per_call"],
                "cpu_source": "serving backend",
            }
        )
    return rows


# -- workers, connections, PgBouncer ----------------------------------------------------


def idle_rows(server: Server, url: str, sizes: Sizes, via: str | None) -> list[dict[str, Any]]:
    """K idle real workers, directly or (``via``) through PgBouncer: per worker-second."""
    rows = []
    extra: Sequence[str] = ()
    setting = "direct, LISTEN, poll 1 s"
    if via is not None:
        extra = ("--database-url", via, "--listen", "false", "--prepared-statements", "false")
        setting = f"PgBouncer pool {POOL}, poll 1 s"
    for workers in sizes.idle_workers:
        _reset(url)
        with running_workers(url, workers, BATCH, extra):
            time.sleep(min(3.0, sizes.idle_seconds))  # past start-up: leadership, first polls
            most, use = server.metered(lambda: _watch(server, sizes.idle_seconds))
        use = Usage(use.seconds, use.server_cpu, use.wal_bytes, most)
        units = round(workers * use.seconds)
        rows.append(row("idle workers", setting, workers, "worker-second", units, use))
    return rows


def _watch(server: Server, seconds: float) -> int:
    """Wait ``seconds``; the most client connections seen meanwhile (sampled every 0.5 s)."""
    most = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        most = max(most, server.connections())
        time.sleep(0.5)
    return most


def idle_server_row(server: Server, seconds: float) -> dict[str, Any]:
    """The server with only the meter connected: its baseline."""
    _, use = server.metered(lambda: time.sleep(seconds))
    return row("idle", "nothing connected", 0, "second", round(use.seconds), use)


def memory_row(url: str, connections: int) -> dict[str, Any]:
    """C idle connections, each used once (a leaseq statement: the catalog caches a worker's
    session fills): their backends' private memory, per connection."""
    conns = [leaseq.connect(url, action="bench") for _ in range(connections)]
    try:
        private = []
        for conn in conns:
            leaseq.Queue(conn).claim([QUEUE], "probe", limit=1)
            private.append(_private_bytes(conn.info.backend_pid))
    finally:
        for conn in conns:
            conn.close()
    return {
        "part": "connection memory",
        "setting": "idle, after one claim",
        "size": connections,
        "unit": "connection",
        "units": connections,
        "server_connections": connections,
        "private_mb_per_unit": round(percentile(private, 50) / 2**20, 2),
    }


def _private_bytes(pid: int) -> float:
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return float(total)


@contextmanager
def pgbouncer(url: str) -> Iterator[Any]:
    """A transaction-pooling PgBouncer of POOL server connections in front of ``url`` (the one
    the fault tests start, tests/support/pgbouncer.py); None when it is not installed."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.append(str(ROOT / "tests"))
    from support import pgbouncer as bouncers

    if not bouncers.available():
        yield None
        return
    bouncer = bouncers.PgBouncer(url, pool_size=POOL)
    try:
        yield bouncer
    finally:
        bouncer.close()


def bouncer_rows(server: Server, url: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Drains and idle workers through PgBouncer, beside the same drains direct."""
    rows = []
    with pgbouncer(url) as bouncer:
        if bouncer is None:
            return [{"part": "pgbouncer jobs", "setting": "skipped: pgbouncer not installed"}]
        for workers in sizes.bouncer_workers:
            for via in (None, bouncer.url):
                # PgBouncer's idle server connections from the last run are not this run's.
                server.disconnect_others()
                _reset(url)
                _enqueue(url, sizes.jobs)
                pid = bouncer.proc.pid if via else None
                finished, use, pooled = drain(server, url, workers, via=via, pooler=pid)
                name = f"PgBouncer pool {POOL}" if via else "direct"
                r = row("pgbouncer jobs", f"W={workers}, {name}", workers, "job", finished, use)
                if via:
                    r["pooler_cpu_ms_per_unit"] = round(pooled * 1000 / max(finished, 1), 4)
                rows.append(r)
        rows += idle_rows(server, url, sizes, bouncer.url)
    return rows


# -- schedules, history ------------------------------------------------------------------


def schedule_rows(server: Server, url: str, sizes: Sizes) -> list[dict[str, Any]]:
    """N schedules every minute: a tick firing each (per fired slot), then idle ticks."""
    rows = []
    for count in sizes.schedules:
        _reset(url)
        with leaseq.connect(url, action="bench") as conn:
            rows += _schedule_rows(server, leaseq.Schedules(conn), count)
    return rows


def _schedule_rows(server: Server, schedules: leaseq.Schedules, count: int) -> list[dict[str, Any]]:
    for n in range(count):
        schedules.add(leaseq.ScheduleSpec(f"s{n}", "* * * * *", QUEUE, "noop"))
    start = schedules.get(f"s{count - 1}").fire_after

    def idle_ticks() -> None:
        # The clock ticks at 10 ms: enough passes to read more than a tick of CPU.
        for n in range(IDLE_TICKS):
            schedules.tick(now=start + timedelta(seconds=121 + n / 100))

    tick, fire = server.metered(lambda: schedules.tick(now=start + timedelta(seconds=121)))
    _, idle = server.metered(idle_ticks)
    return [
        row("schedules", "every minute, one tick", count, "fired slot", len(tick.fired), fire),
        row("schedules", "a tick with nothing due", count, "pass", IDLE_TICKS, idle),
    ]


def history_rows(server: Server, url: str, sizes: Sizes) -> list[dict[str, Any]]:
    """N finished jobs moved to the partitioned history: per moved job."""
    _reset(url)
    _enqueue(url, sizes.history)
    drain(server, url, 2)
    with leaseq.connect(url, action="bench") as conn:
        history = History(conn)
        history.ensure_partitions(ahead=2, timeout=60)

        def move_all() -> int:
            moved = 0
            while step := history.move(hot_retention=0, batch=5000, timeout=120).moved:
                moved += step
            return moved

        moved, use = server.metered(move_all)
    return [row("history", "mover, batches of 5000", sizes.history, "moved job", moved, use)]


# -- the scenario --------------------------------------------------------------------------


def measure(url: str, sizes: Sizes, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every part once, in order; rows as :func:`row`."""
    server = Server(url)
    try:
        rows = [idle_server_row(server, sizes.idle_seconds / 2)]
        parts: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = [
            ("enqueue", lambda: enqueue_rows(server, url, sizes.jobs)),
            ("jobs and keys", lambda: job_rows(server, url, sizes)),
            ("leases", lambda: lease_rows(url, sizes)),
            ("idle workers", lambda: idle_rows(server, url, sizes, None)),
            ("connection memory", lambda: [memory_row(url, sizes.connections)]),
            ("pgbouncer", lambda: bouncer_rows(server, url, sizes)),
            ("schedules", lambda: schedule_rows(server, url, sizes)),
            ("history", lambda: history_rows(server, url, sizes)),
        ]
        for name, part in parts:
            started = time.perf_counter()
            found = part()
            log(f"capacity {name}: {len(found)} rows in {time.perf_counter() - started:.0f} s")
            rows += found
        return rows
    finally:
        server.close()


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with scratch_database(ctx.server_url, "capacity") as url:
        try:
            Server(url).close()
        except LookupError:
            ctx.log("capacity: the server is not on this host; skipped")
            return
        for n in range(1, sizes.rounds + 1):
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            found = measure(url, sizes, ctx.log)
            rows += [{"round": n, "loadavg": load, **r} for r in found]
    recorder = ctx.recorder(NAME)
    recorder.params({**vars(sizes), "seconds": round(time.monotonic() - started, 1)})
    recorder.table(NAME, rows)
