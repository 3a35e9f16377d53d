"""Fault injection: real workers and reapers under random SIGKILL, SIGSTOP/SIGCONT, SIGTERM
and pg_terminate_backend, with PostgreSQL restarted twice (fast, then immediate), then the
invariants checked in SQL. About two minutes.

Numbers (printed): attempts spent on infrastructure faults (attempts that failed, or leases
that expired on a worker nobody killed or stopped), and kill-to-reclaim times."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from faultkit import HERE, worker_args

import leaseq
from support.flowcheck import max_running
from support.pgserver import RestartablePostgres
from support.polling import wait_for
from support.workers import WorkerProcess, Workers

pytestmark = pytest.mark.faults

JOBS = 300
WORKERS = 4
REAPERS = 2
LEASE = 10.0
HEARTBEAT = 1.0
REAP_INTERVAL = 0.5
LEADER_TTL = 3.0
CHAOS_SECONDS = 60.0
ACTIONS = ["kill", "stop", "term", "backends", "backends", "reaper_stop", "reaper_kill"]
SEED = int(os.environ.get("LEASEQ_FAULTS_SEED", random.randrange(1 << 30)))


@dataclass
class Reaper:
    holder: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Chaos:
    """The harness's record of what it did, by worker id: (start, end) of kills and stops."""

    url: str
    workdir: Path
    workers: Workers
    rng: random.Random
    live: dict[str, WorkerProcess] = field(default_factory=dict)
    reapers: dict[str, Reaper] = field(default_factory=dict)
    stopped: dict[str, float] = field(default_factory=dict)
    harmed: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    kills: list[tuple[str, float]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    generation: int = 0
    plan: list[str] = field(default_factory=list)
    planned: bool = False

    def spawn_worker(self, worker_id: str) -> None:
        self.live[worker_id] = self.workers.start(
            worker_id, *worker_args(concurrency=3, lease=LEASE, heartbeat=HEARTBEAT, poll=0.5)
        )

    def spawn_reaper(self, holder: str) -> None:
        log = self.workdir / f"{holder}.{self.generation}.log"
        self.generation += 1
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "leaseq.cli", "reaper",
                 "--operator-id", holder,
                 "--reap-interval-seconds", str(REAP_INTERVAL),
                 "--leader-ttl-seconds", str(LEADER_TTL),
                 "--log-level", "INFO"],
                env={**os.environ, "LEASEQ_DATABASE_URL": self.url},
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.reapers[holder] = Reaper(holder, proc, log)

    def act(self) -> None:
        """One fault: each kind once first (in random order), then random ones."""
        if not self.plan and not self.planned:
            self.plan = self.rng.sample(ACTIONS, len(ACTIONS))
            self.planned = True
        action = self.plan.pop() if self.plan else self.rng.choice(ACTIONS)
        now = time.time()
        if action in ("kill", "stop", "term"):
            running = [w for w in self.live if w not in self.stopped]
            if not running:
                return
            victim = self.rng.choice(running)
            proc = self.live[victim].proc
            if action == "kill":
                proc.kill()
                proc.wait(timeout=10)
                self.harmed[victim].append((now, now))
                self.kills.append((victim, now))
                # Half the time the worker comes back under the same id (a restarted pod).
                self.respawn(victim, same_id=self.rng.random() < 0.5)
            elif action == "stop":
                proc.send_signal(signal.SIGSTOP)
                self.stopped[victim] = now
            else:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
                self.respawn(victim, same_id=True)
            self.log.append(f"{now:.2f} {action} {victim}")
        elif action == "backends":
            with psycopg.connect(self.url, autocommit=True) as conn:
                n = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND application_name LIKE 'leaseq%%' AND random() < 0.5"
                ).fetchone()
            self.log.append(f"{now:.2f} terminated {n[0] if n else 0} backends")
        else:
            holder = self.rng.choice(sorted(self.reapers))
            reaper = self.reapers[holder]
            if action == "reaper_kill":
                reaper.proc.kill()
                reaper.proc.wait(timeout=10)
                self.spawn_reaper(holder)
            else:
                reaper.proc.send_signal(signal.SIGSTOP)
                time.sleep(self.rng.uniform(0.5, 2 * LEADER_TTL))
                reaper.proc.send_signal(signal.SIGCONT)
            self.log.append(f"{now:.2f} {action} {holder}")

    def wake(self, older_than: float) -> None:
        """SIGCONT workers stopped for more than ``older_than`` seconds."""
        now = time.time()
        for victim, since in list(self.stopped.items()):
            if now - since >= older_than:
                self.live[victim].proc.send_signal(signal.SIGCONT)
                self.harmed[victim].append((since, now))
                del self.stopped[victim]
                self.log.append(f"{now:.2f} cont {victim} after {now - since:.1f}s")

    def respawn(self, victim: str, *, same_id: bool) -> None:
        del self.live[victim]
        new_id = victim if same_id else f"{victim.split('.')[0]}.{self.generation}"
        self.generation += 1
        self.spawn_worker(new_id)


def restart(server: RestartablePostgres, mode: str, chaos: Chaos) -> None:
    """Restart PostgreSQL. An outage at least as long as the lease (less a heartbeat) may
    expire every lease, legitimately: it is recorded as harm to every worker (and printed);
    shorter ones must cost nothing."""
    t0 = time.time()
    server.stop(mode)
    server.start()
    down = time.time() - t0
    chaos.log.append(f"{t0:.2f} restart {mode} ({down:.1f}s down)")
    if down >= LEASE - HEARTBEAT:
        chaos.log.append(f"{t0:.2f} outage of {down:.1f}s is not shorter than the lease")
        chaos.harmed["*"].append((t0, t0 + down))


def check_invariants(url: str, chaos: Chaos) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        q = conn.execute
        unfinished = q(
            "SELECT id, status::text FROM leaseq.jobs WHERE status IN ('pending', 'running')"
        ).fetchall()
        assert unfinished == [], "every job terminal"
        effects = q(
            "SELECT j.id, j.status::text, count(r.*) FROM leaseq.jobs j"
            " LEFT JOIN leaseq.job_results r ON r.job_id = j.id"
            " GROUP BY j.id, j.status"
            " HAVING count(r.*) <> CASE WHEN j.status = 'succeeded'"
            "                            AND j.idempotency_key IS NOT NULL THEN 1 ELSE 0 END"
        ).fetchall()
        assert effects == [], "one effect per succeeded keyed job, none for the others"
        miscounted = q(
            "SELECT j.id, j.attempt_count, count(a.*) AS claims,"
            "       count(*) FILTER (WHERE a.outcome = 'released') AS releases"
            "  FROM leaseq.jobs j LEFT JOIN leaseq.job_attempts a ON a.job_id = j.id"
            " GROUP BY j.id"
            " HAVING j.attempt_count <> count(a.*) - count(*) FILTER (WHERE a.outcome = 'released')"
        ).fetchall()
        assert miscounted == [], "attempts == claims - releases"
        stale = q(
            "SELECT j.id FROM leaseq.jobs j"
            "  JOIN leaseq.job_attempts a ON a.job_id = j.id AND a.outcome = 'succeeded'"
            "  JOIN leaseq.job_results r ON r.job_id = j.id"
            " WHERE (j.result->>'token')::bigint <> a.lease_token"
            "    OR (r.result->>'token')::bigint <> a.lease_token"
            "    OR a.lease_token <> j.lease_token"
        ).fetchall()
        assert stale == [], "no stale token in any result"
        doubles = q(
            "SELECT job_id, count(*) FROM leaseq.job_attempts WHERE outcome = 'succeeded'"
            " GROUP BY job_id HAVING count(*) > 1"
        ).fetchall()
        assert doubles == [], "one succeeded attempt per job"
        # Every reaped attempt names its reaper and term; one pass (one transaction time)
        # is one reaper in one term, and terms never go backwards: never two reapers at once.
        passes = q(
            "SELECT ended_at, array_agg(DISTINCT substring(error FROM 'reaped by (.*)\\)$'))"
            "  FROM leaseq.job_attempts"
            " WHERE outcome IN ('lease_expired', 'timed_out') AND error LIKE '%%reaped by%%'"
            " GROUP BY ended_at ORDER BY ended_at"
        ).fetchall()
        assert all(len(reapers) == 1 for _, reapers in passes), passes
        terms = [int(r[0].rsplit(" term ", 1)[1]) for _, r in passes]
        assert terms == sorted(terms), "a reaper acted after a newer term began"
        failed = q(
            "SELECT job_id, error FROM leaseq.job_attempts WHERE outcome = 'failed'"
        ).fetchall()
        expired = q(
            "SELECT worker, extract(epoch FROM started_at)::float8,"
            "       extract(epoch FROM ended_at)::float8"
            "  FROM leaseq.job_attempts WHERE outcome IN ('lease_expired', 'fenced')"
        ).fetchall()
        claims = q("SELECT count(*) FROM leaseq.job_attempts").fetchone()
        reclaims = q(
            "SELECT a.worker, extract(epoch FROM a.started_at)::float8,"
            "       extract(epoch FROM a.ended_at)::float8,"
            "       extract(epoch FROM min(b.started_at))::float8"
            "  FROM leaseq.job_attempts a JOIN leaseq.job_attempts b"
            "    ON b.job_id = a.job_id AND b.lease_token > a.lease_token"
            " WHERE a.outcome IN ('lease_expired', 'fenced') GROUP BY a.job_id, a.lease_token,"
            "       a.worker, a.ended_at"
        ).fetchall()
    # An expired lease costs an attempt legitimately only when its worker was killed or
    # stopped during the attempt; any other expiry, and every failed attempt, is an
    # infrastructure fault that cost an attempt.
    unexplained = [
        (worker, start, end)
        for worker, start, end in expired
        if not any(
            h_start <= end and h_end >= (start or 0) - LEASE
            for h_start, h_end in [*chaos.harmed.get(worker, []), *chaos.harmed.get("*", [])]
        )
    ]
    # From a SIGKILL to the next claim of each job its victim held then.
    kill_to_reclaim = [
        reclaimed - killed
        for victim, killed in chaos.kills
        for worker, started, ended, reclaimed in reclaims
        if worker == victim and started and reclaimed and started <= killed <= min(ended, reclaimed)
    ]
    print(f"seed {SEED}; {claims[0] if claims else 0} claims; {len(passes)} reap passes")
    print(f"attempts failed: {len(failed)}; unexplained lease expiries: {unexplained}")
    if kill_to_reclaim:
        print(
            f"kill-to-reclaim: n={len(kill_to_reclaim)} min {min(kill_to_reclaim):.2f}s "
            f"max {max(kill_to_reclaim):.2f}s (lease {LEASE}s, reap every {REAP_INTERVAL}s)"
        )
    assert failed == [], "an infrastructure fault failed an attempt"
    assert unexplained == [], "a lease expired on a worker nobody killed or stopped"
    return {"failed": len(failed), "unexplained": len(unexplained)}


#: The keyed run's keys and their limit (small: the keyed run is the shorter one).
KEYS = ("t0", "t1", "t2")
KEY_LIMIT = 2


def check_key_limits(url: str) -> None:
    """Keyed run: no unit of a limit leaked, the reaper's check finds nothing to repair, and
    no key ever ran more than its limit. Attempts later rewritten `fenced` are left out of
    the count: their row's end is when a stopped worker woke and called in, long after the
    reaper took the lease (and the unit) back."""
    with psycopg.connect(url, autocommit=True) as conn:
        held = conn.execute(
            "SELECT count(*) FROM leaseq.flow_slots WHERE job_id IS NOT NULL"
        ).fetchone()
        assert held == (0,), "a unit of a limit leaked"
        rows = conn.execute(
            "SELECT j.key, a.started_at, a.ended_at FROM leaseq.job_attempts a"
            " JOIN leaseq.jobs j ON j.id = a.job_id"
            " WHERE j.key IS NOT NULL AND a.outcome <> 'fenced' AND a.started_at IS NOT NULL"
        ).fetchall()
    spans: dict[str, list[tuple[datetime, datetime | None]]] = defaultdict(list)
    for key, start, end in rows:
        spans[str(key)].append((start, end))  # type: ignore[arg-type]
    seen = {key: max_running(spans[key]) for key in KEYS}
    print(f"most running at once per key (limit {KEY_LIMIT}): {seen}")
    assert all(n <= KEY_LIMIT for n in seen.values()), seen
    with leaseq.connect(url, action="test") as c:
        assert leaseq.FlowControl(c).repair() == {}


@pytest.mark.parametrize("keyed", [False, True], ids=["keyless", "keyed"])
def test_random_faults_keep_every_invariant(
    restartable: RestartablePostgres, restartable_url: str, tmp_path: Path, keyed: bool
) -> None:
    rng = random.Random(SEED)
    url = restartable_url
    # The keyed run is half as long, on a quarter of the jobs, each with one of three keys limited
    # to KEY_LIMIT running jobs.
    jobs, chaos_seconds = (JOBS // 4, CHAOS_SECONDS / 2) if keyed else (JOBS, CHAOS_SECONDS)
    with leaseq.connect(url, action="test") as conn:
        queue = leaseq.Queue(conn)
        if keyed:
            for key in KEYS:
                leaseq.FlowControl(conn).set_limit("q", key, max_running=KEY_LIMIT)
        queue.enqueue_many(
            [
                leaseq.JobSpec(
                    "q",
                    "step",
                    {"seconds": rng.uniform(0.5, 4.0), "checkpoint_every": rng.choice([None, 0.3])},
                    max_attempts=25,
                    key=rng.choice(KEYS) if keyed else None,
                    # Half with an effect key (one effect row each), half without (none).
                    idempotency_key=f"chaos-{i}" if i % 2 == 0 else None,
                )
                for i in range(jobs)
            ]
        )
    chaos = Chaos(url, tmp_path, Workers(url, tmp_path, pythonpath=[HERE]), rng)
    try:
        for n in range(REAPERS):
            chaos.spawn_reaper(f"reaper-{n}")
        for n in range(WORKERS):
            chaos.spawn_worker(f"w{n}")
        end = time.monotonic() + chaos_seconds
        restarts = {chaos_seconds * 0.3: "fast", chaos_seconds * 0.7: "immediate"}
        while time.monotonic() < end:
            elapsed = chaos_seconds - (end - time.monotonic())
            for at, mode in list(restarts.items()):
                if elapsed >= at:
                    restart(restartable, mode, chaos)
                    del restarts[at]
            chaos.act()
            chaos.wake(older_than=rng.uniform(0.5, 2.5 * LEASE))
            time.sleep(rng.uniform(0.3, 1.2))
        chaos.wake(older_than=0)
        for reaper in chaos.reapers.values():
            reaper.proc.send_signal(signal.SIGCONT)
        with leaseq.connect(url, action="test") as conn:
            queue = leaseq.Queue(conn)
            wait_for(
                lambda: all(s.ready == s.scheduled == s.running == 0 for s in queue.stats(["q"])),
                "every job to finish",
                timeout=240,
            )
        check_invariants(url, chaos)
        if keyed:
            check_key_limits(url)
    finally:
        print("\n".join(chaos.log))
        for reaper in chaos.reapers.values():
            reaper.proc.send_signal(signal.SIGCONT)
            reaper.proc.kill()
            reaper.proc.wait(timeout=10)
        chaos.workers.stop_all()
