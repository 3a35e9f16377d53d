"""``leaseq demo``: real workers, a SIGKILL and a SIGTERM, and an account of every job.

Starts an embedded PostgreSQL unless ``--database-url`` is given, migrates, enqueues
simulated inference jobs in a queue of its own, runs three ``leaseq worker`` processes with
short leases, kills one mid-job (SIGKILL) and stops another (SIGTERM, then starts a
replacement the way a Deployment would), reaps expired leases itself (the operator's job in
production) and finally checks every invariant it promises. Exit status 1 if one broke.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from leaseq import config as settings
from leaseq.core.db import connect
from leaseq.core.errors import ConfigError
from leaseq.core.models import FINISHED_STATUSES, JobRecord, RetryPolicy
from leaseq.core.queue import JobSpec, Queue
from leaseq.core.redact import redact
from leaseq.core.schema import migrate
from leaseq.core.workers import Workers
from leaseq.demo.embedded import EmbeddedPostgres, stop_kept

LEASE_SECONDS = 3.0
HEARTBEAT_SECONDS = 0.5
DRAIN_SECONDS = 0.5
CONCURRENCY = 4
REAP_EVERY = 0.5
TIME_LIMIT = 50.0


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    fate: str = "running"


@dataclass
class Chaos:
    """What the demo did to the workers, and when (monotonic seconds)."""

    killed_at: float | None = None
    killed_jobs: list[int] = field(default_factory=list)
    terminated_at: float | None = None
    terminated_jobs: list[int] = field(default_factory=list)
    reaped: dict[int, float] = field(default_factory=dict)


class Demo:
    def __init__(self, url: str, jobs: int) -> None:
        self.url = url
        self.count = jobs
        self.queue_name = f"demo-{secrets.token_hex(3)}"
        self.workdir = Path(tempfile.mkdtemp(prefix="leaseq-demo-"))
        self.procs: dict[str, Proc] = {}
        self.chaos = Chaos()
        self.start = time.monotonic()
        self.tty = sys.stdout.isatty()
        self._stop_reaper = threading.Event()

    # -- output -----------------------------------------------------------------------

    def t(self) -> str:
        return f"[{time.monotonic() - self.start:5.1f}s]"

    def say(self, text: str) -> None:
        if self.tty:
            print("\r\033[K", end="")
        print(f"{self.t()} {text}", flush=True)

    # -- steps ------------------------------------------------------------------------

    def run(self) -> int:
        with connect(self.url, action="demo") as conn:
            report = migrate(conn)
            self.say(f"schema at version {report.version}; queue {self.queue_name}")
            queue = Queue(conn)
            ids = self.enqueue(queue)
            reaper = threading.Thread(target=self.reap_loop, daemon=True)
            reaper.start()
            try:
                for n in (1, 2, 3):
                    self.spawn(f"w{n}")
                finished = self.watch(queue)
            finally:
                self._stop_reaper.set()
                self.stop_all()
                reaper.join(timeout=5)
                # The SIGKILLed worker could not deregister; in production the operator
                # prunes such stale rows.
                Workers(conn).remove(self.procs["w1"].name)
            return self.summary(queue, ids, finished)

    def enqueue(self, queue: Queue) -> dict[str, int]:
        rng = random.Random(7)
        specs = []
        for i in range(self.count):
            payload: dict[str, object] = {
                "doc": f"scan-{i:03d}.pdf",
                "seconds": 1 + 2 * rng.random(),
            }
            attempts = 5
            if i == 1:
                payload["flaky"] = True
            if i == 2:
                payload["always_fails"] = True
                attempts = 2
            specs.append(
                JobSpec(
                    queue=self.queue_name,
                    job_type="infer",
                    payload=payload,
                    max_attempts=attempts,
                    idempotency_key=f"{self.queue_name}:{payload['doc']}",
                )
            )
        enqueued = queue.enqueue_many(specs)
        self.say(
            f"enqueued {len(specs)} inference jobs (1-3 s each; job {enqueued[1].job_id} is "
            f"flaky, job {enqueued[2].job_id} always fails)"
        )
        return {"flaky": enqueued[1].job_id, "broken": enqueued[2].job_id}

    def spawn(self, key: str) -> None:
        # Worker ids unique to this run: several demos may share one database.
        name = f"{self.queue_name}-{key}"
        log = self.workdir / f"{key}.log"
        cmd = [
            sys.executable, "-m", "leaseq.cli", "worker",
            "--app", "leaseq.demo.app:registry",
            "--queue", self.queue_name,
            "--concurrency", str(CONCURRENCY),
            "--lease-seconds", str(LEASE_SECONDS),
            "--heartbeat-seconds", str(HEARTBEAT_SECONDS),
            "--poll-seconds", "1",
            "--drain-seconds", str(DRAIN_SECONDS),
            "--worker-id", name,
            "--metrics-port", "0",
            "--log-format", "json",
        ]  # fmt: skip
        env = {**os.environ, "LEASEQ_DATABASE_URL": self.url}
        with log.open("wb") as out:
            popen = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        self.procs[key] = Proc(name, popen, log)
        self.say(f"started worker {name} (pid {popen.pid}, {CONCURRENCY} slots)")

    def reap_loop(self) -> None:
        with connect(self.url, action="reap") as conn:
            queue = Queue(conn, retry=RetryPolicy(base_seconds=0.5, cap_seconds=2.0))
            while not self._stop_reaper.wait(REAP_EVERY):
                for job in queue.reap():
                    self.chaos.reaped.setdefault(job.job_id, time.monotonic())
                    self.say(
                        f"reaper: job {job.job_id}'s lease from {job.previous_owner} expired "
                        f"-> {job.status}"
                    )

    def held_by(self, jobs: list[JobRecord], name: str) -> list[int]:
        return sorted(j.id for j in jobs if j.status == "running" and j.lease_owner == name)

    @staticmethod
    def step(job: JobRecord) -> int:
        return int(job.progress.get("step", 0)) if isinstance(job.progress, dict) else 0

    def holds(self, jobs: list[JobRecord], name: str, steps: range) -> bool:
        """``name`` runs at least one job whose last reported step is in ``steps``."""
        return any(
            j.status == "running" and j.lease_owner == name and self.step(j) in steps for j in jobs
        )

    def watch(self, queue: Queue) -> bool:
        """Cause the chaos, print progress; True when every job finished in time."""
        last_line = 0.0
        while time.monotonic() - self.start < TIME_LIMIT:
            jobs = queue.jobs(queue=self.queue_name, limit=10_000)
            self.chaos_step(jobs)
            if all(j.status in FINISHED_STATUSES for j in jobs):
                self.progress(jobs)
                if self.tty:
                    print()
                return True
            if self.tty or time.monotonic() - last_line >= 2:
                self.progress(jobs)
                last_line = time.monotonic()
            time.sleep(0.25)
        self.say(f"gave up after {TIME_LIMIT:.0f}s")
        return False

    def chaos_step(self, jobs: list[JobRecord]) -> None:
        c = self.chaos
        w1, w2 = self.procs["w1"], self.procs["w2"]
        # Kill once a job has saved a checkpoint (step 3), so its next attempt resumes.
        if c.killed_at is None and self.holds(jobs, w1.name, range(4, 8)):
            c.killed_jobs = self.held_by(jobs, w1.name)
            w1.popen.send_signal(signal.SIGKILL)
            w1.fate = "killed"
            c.killed_at = time.monotonic()
            self.say(
                f"SIGKILL {w1.name} while it runs jobs {c.killed_jobs}: their leases must "
                f"expire ({LEASE_SECONDS:.0f}s) before the reaper can return them"
            )
        elif (
            c.killed_at is not None
            and c.terminated_at is None
            and self.holds(jobs, w2.name, range(4, 7))
        ):
            c.terminated_jobs = self.held_by(jobs, w2.name)
            w2.popen.send_signal(signal.SIGTERM)
            w2.fate = "terminated"
            c.terminated_at = time.monotonic()
            self.say(
                f"SIGTERM {w2.name} while it runs jobs {c.terminated_jobs}: it stops claiming, "
                f"gives them {DRAIN_SECONDS}s to finish and releases the rest at once"
            )
        elif w2.fate == "terminated" and w2.popen.poll() is not None:
            w2.fate = f"exited {w2.popen.returncode}"
            self.say(f"{w2.name} exited with status {w2.popen.returncode}; starting a replacement")
            self.spawn("w4")

    def progress(self, jobs: list[JobRecord]) -> None:
        states = Counter(str(j.status) for j in jobs)
        retrying = sum(1 for j in jobs if j.status == "pending" and j.attempt_count > 0)
        workers = " ".join(
            f"{key}:{p.fate if p.fate != 'running' else len(self.held_by(jobs, p.name))}"
            for key, p in self.procs.items()
        )
        line = (
            f"{self.t()} pending {states['pending']:2d} (retrying {retrying}) | running "
            f"{states['running']:2d} | succeeded {states['succeeded']:2d} | dead "
            f"{states['dead']} || {workers}"
        )
        if self.tty:
            print(f"\r\033[K{line}", end="", flush=True)
        else:
            print(line, flush=True)

    def stop_all(self) -> None:
        stop_processes([p.popen for p in self.procs.values()], timeout=15)

    # -- the account ------------------------------------------------------------------

    def summary(self, queue: Queue, ids: dict[str, int], finished: bool) -> int:
        jobs = {j.id: j for j in queue.jobs(queue=self.queue_name, limit=10_000)}
        attempts = {job_id: queue.attempts(job_id) for job_id in jobs}
        broken: list[str] = []

        def check(ok: bool, claim: str) -> None:
            print(f"  {'ok  ' if ok else 'FAIL'} {claim}")
            if not ok:
                broken.append(claim)

        states = Counter(str(j.status) for j in jobs.values())
        outcomes = Counter(str(a.outcome) for rows in attempts.values() for a in rows)
        elapsed = time.monotonic() - self.start
        print()
        print(f"== summary after {elapsed:.1f}s: {len(jobs)} jobs ==")
        print(
            f"  jobs: {states['succeeded']} succeeded, {states['dead']} dead; attempts by "
            f"outcome: {dict(sorted(outcomes.items()))}"
        )
        per_job = Counter(j.attempt_count for j in jobs.values())
        print(f"  attempts per job: {dict(sorted(per_job.items()))}")
        c = self.chaos
        if c.killed_at is not None:
            for job_id in c.killed_jobs:
                reaped = c.reaped.get(job_id)
                after = f"{reaped - c.killed_at:.1f}s after the kill" if reaped else "never"
                print(
                    f"  killed with {self.procs['w1'].name}: job {job_id} reclaimed {after},"
                    f" then {jobs[job_id].status} on attempt {jobs[job_id].attempt_count},"
                    f" resumed from checkpoint step {self.resumed(jobs[job_id])}"
                )
        released = sorted(
            {a.job_id for rows in attempts.values() for a in rows if a.outcome == "released"}
        )
        if c.terminated_at is not None:
            print(
                f"  SIGTERM {self.procs['w2'].name}: held {c.terminated_jobs}; finished in "
                f"the drain window: {[i for i in c.terminated_jobs if i not in released]}; "
                f"released at once: {released}, resumed from checkpoint steps "
                f"{[self.resumed(jobs[i]) for i in released]} on "
                f"{[jobs[i].lease_owner for i in released]}"
            )
        print()
        print("invariants:")
        check(finished, "every job reached a final state within the time limit")
        check(
            all(j.status in ("succeeded", "dead") for j in jobs.values()),
            "every job ended succeeded or dead (none lost, none stuck)",
        )
        check(
            [i for i, j in jobs.items() if j.status == "dead"] == [ids["broken"]],
            f"only the always-failing job {ids['broken']} is dead, with its last error kept",
        )
        check(
            bool(jobs[ids["broken"]].last_error) and jobs[ids["broken"]].attempt_count == 2,
            "the always-failing job used its 2 attempts and kept its error",
        )
        flaky = jobs[ids["flaky"]]
        check(
            flaky.status == "succeeded"
            and [a.outcome for a in attempts[flaky.id]] == ["failed", "succeeded"],
            f"the flaky job {flaky.id} failed once, then succeeded on attempt 2",
        )
        check(
            c.killed_at is not None
            and all(
                jobs[i].status == "succeeded"
                and any(
                    a.worker == self.procs["w1"].name and a.outcome == "lease_expired"
                    for a in attempts[i]
                )
                for i in c.killed_jobs
            ),
            "every job of the SIGKILLed worker expired, was reaped and then succeeded elsewhere",
        )
        check(
            self.procs["w2"].popen.returncode == 0
            and all(jobs[i].status == "succeeded" for i in c.terminated_jobs)
            and all(
                next(a.worker for a in attempts[i] if a.outcome == "succeeded")
                != self.procs["w2"].name
                for i in released
            ),
            "the SIGTERMed worker exited 0; what it released finished on another worker",
        )
        succeeded = [j for j in jobs.values() if j.status == "succeeded"]
        check(
            all(
                sum(a.outcome == "succeeded" for a in attempts[j.id]) == (j.status == "succeeded")
                for j in jobs.values()
            ),
            "every succeeded job has exactly one successful attempt, the others none",
        )
        effects = [queue.effect(j.idempotency_key or "") for j in succeeded]
        check(
            all(e is not None and e.job_id == j.id for e, j in zip(effects, succeeded, strict=True))
            and queue.effect(jobs[ids["broken"]].idempotency_key or "") is None,
            f"{len(succeeded)} effects written: one per succeeded job, none for the dead one",
        )
        logs = ", ".join(str(p.log) for p in self.procs.values())
        if broken:
            print(f"\n{len(broken)} invariant(s) BROKEN. Worker logs: {logs}")
            return 1
        print(f"\nall invariants hold. Worker logs (JSON lines): {logs}")
        return 0

    @staticmethod
    def resumed(job: JobRecord) -> int:
        result = job.result if isinstance(job.result, dict) else {}
        return int(result.get("resumed_from_step", 0))


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM the processes still running, give each ``timeout`` seconds, then SIGKILL."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(args: argparse.Namespace) -> int:
    """Run the demo against an embedded server (kept running afterwards with ``--keep``),
    or against ``--database-url`` only when that flag is given; ``--stop DIR`` stops a kept
    one.

    LEASEQ_DATABASE_URL is ignored on purpose: the quickstart exports it for the other
    commands, and the demo migrates the database it uses and leaves its jobs there, which no
    one should get from a variable set for something else (the README promises the demo needs
    no database). Writing to a real database is said loudly, before anything is written."""
    if args.stop is not None:
        stop_kept(Path(args.stop))
        print(f"stopped the demo's PostgreSQL and deleted {args.stop}")
        return 0
    if args.jobs < 3:
        raise ConfigError("--jobs must be at least 3 (one flaky, one failing, one normal)")
    logging.basicConfig(level=logging.ERROR)
    url = settings.resolve(args, [settings.DATABASE_URL], environ={})["database_url"]
    server = None
    if url is not None:
        print(
            f"WRITING TO YOUR DATABASE {redact(url)}: the demo migrates it (leaseq schema), "
            f"enqueues {args.jobs} jobs and leaves them there. Without --database-url it uses "
            "an embedded PostgreSQL instead.",
            flush=True,
        )
    else:
        if settings.DATABASE_URL.env in os.environ:
            print(
                f"{settings.DATABASE_URL.env} is set but not used: the demo writes only to its "
                "own embedded PostgreSQL unless given --database-url."
            )
        print("starting an embedded PostgreSQL (pass --database-url to use your own) ...")
        server = EmbeddedPostgres(keep=args.keep)
        url = server.url
    demo = Demo(url, args.jobs)
    finished = False
    try:
        code = demo.run()
        finished = True
        return code
    finally:
        if server is not None:
            server.stop()
        # After an error too when a kept server is left running: say how to stop it.
        if finished or (server is not None and server.keep):
            print(_afterwards(url, demo.queue_name, server))


def _afterwards(url: str, queue: str, server: EmbeddedPostgres | None) -> str:
    """How to look at what the demo left, or how to keep it next time."""
    if server is not None and not server.keep:
        return (
            "\nThe embedded PostgreSQL is stopped and deleted. To look at the jobs afterwards, "
            "run `leaseq demo --keep`."
        )
    # The embedded server's URL has no password; a URL of your own may, so it is not echoed.
    shown = shlex.quote(url) if server is not None else "URL"
    lines = [
        "",
        "The demo's database is still there. Look at it with:",
        f"  leaseq status --database-url {shown}",
        f"  leaseq jobs list --queue {queue} --database-url {shown}",
    ]
    if server is not None:
        lines += [
            "Stop it and delete its files with:",
            f"  leaseq demo --stop {shlex.quote(str(server.root))}",
        ]
    else:
        lines.append("(URL: the database URL you gave the demo)")
    return "\n".join(lines)
