"""``leaseq demo --steps``: agent jobs whose two paid model calls are durable steps
(leaseq.examples.agent), with a worker SIGKILLed between the two, after the second call was
billed and before its result was recorded; and an account of what was paid.

Starts an embedded PostgreSQL unless a database URL is given, migrates, enqueues the jobs,
runs two ``leaseq worker`` processes, SIGKILLs one once a job it runs has its first step
recorded and its second billed (and starts a replacement), reaps expired leases itself (the
operator's job in production), and checks: every job succeeded; each paid call was billed
once (two ledger lines per job); the killed job's first step was recorded by its first
attempt and not called again; its second step was recorded by its second attempt under the
same key. Exit status 1 if one of these broke.
"""

from __future__ import annotations

import signal
import time

import leaseq
from leaseq.core.errors import ConfigError
from leaseq.core.models import FINISHED_STATUSES
from leaseq.demo.harness import Harness, with_server
from leaseq.examples.agent import CALL_SECONDS_ENV

APP = "leaseq.examples.agent:registry"
LEASE_SECONDS = 3.0
#: How long a call takes after it is billed: the window for the kill.
CALL_SECONDS = 1.0
TIME_LIMIT = 120.0


class StepsDemo(Harness):
    def __init__(self, url: str, jobs: int) -> None:
        super().__init__(
            url, "steps-demo", APP,
            worker_args=["--concurrency", "2", "--lease-seconds", str(LEASE_SECONDS),
                         "--heartbeat-seconds", str(LEASE_SECONDS / 6)],
            worker_env={CALL_SECONDS_ENV: str(CALL_SECONDS)},
        )  # fmt: skip
        self.jobs = jobs
        self.ledger = self.workdir / "ledger"

    def run(self) -> int:
        with leaseq.connect(self.url, action="demo") as conn:
            leaseq.migrate(conn)
            queue = leaseq.Queue(conn)
            payload = {"ledger": str(self.ledger)}
            ids = [
                queue.enqueue(
                    self.queue_name, "agent.answer", {**payload, "question": f"q{n}"}
                ).job_id
                for n in range(self.jobs)
            ]
            self.say(f"enqueued {self.jobs} agent jobs, two paid model calls each")
            finished = self.run_workers(
                ["w1", "w2"],
                lambda: self.watch(queue, ids),
                retry=leaseq.RetryPolicy(base_seconds=0.2, cap_seconds=1),
                reap_every=0.3,
            )
            return self.summary(queue, ids, finished)

    def billed(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []

    def watch(self, queue: leaseq.Queue, ids: list[int]) -> bool:
        while time.monotonic() - self.start < TIME_LIMIT:
            if not self.killed:
                self.maybe_kill(queue, ids)
            if all(queue.get(i).status in FINISHED_STATUSES for i in ids):
                return True
            time.sleep(0.05)
        return False

    def maybe_kill(self, queue: leaseq.Queue, ids: list[int]) -> None:
        """SIGKILL w1 while a job it runs has its plan recorded and its answer billed but not
        recorded: between two paid steps, the second one's outcome uncertain."""
        name = self.worker_name("w1")
        billed = set(self.billed())
        for job_id in ids:
            job = queue.get(job_id)
            if job.status != "running" or job.lease_owner != name:
                continue
            steps = {s.name: s for s in queue.steps(job_id)}
            plan, answer = steps.get("plan"), steps.get("answer")
            key = f"job:{job_id}:step:answer"
            if plan and plan.recorded and answer and answer.intended and key in billed:
                self.killed.append(job_id)
                self.procs["w1"].send_signal(signal.SIGKILL)
                self.say(
                    f"SIGKILL {name} in job {job_id}: plan recorded, answer billed and not "
                    f"recorded; the lease expires in {LEASE_SECONDS:.0f}s"
                )
                self.spawn("w3")
                return

    def summary(self, queue: leaseq.Queue, ids: list[int], finished: bool) -> int:
        elapsed = time.monotonic() - self.start
        check = self.check
        print(f"\n== {len(ids)} agent jobs in {elapsed:.0f}s ==")
        check(finished, "every job reached a final state within the time limit")
        check(all(queue.get(i).status == "succeeded" for i in ids), "every job succeeded")
        billed = self.billed()
        expected = sorted(f"job:{i}:step:{s}" for i in ids for s in ("plan", "answer"))
        check(
            sorted(billed) == expected,
            f"every paid call was billed exactly once: {len(billed)} bills for "
            f"{len(expected)} calls",
        )
        for job_id in self.killed:
            steps = {s.name: s for s in queue.steps(job_id)}
            attempts = [str(a.outcome) for a in queue.attempts(job_id)]
            check(
                steps["plan"].attempt == 1 and steps["answer"].attempt == 2,
                f"job {job_id}: plan recorded by attempt 1 and not called again, answer "
                f"called again by attempt 2 under the same key (attempts: {attempts})",
            )
            items = [item.value for item in queue.stream(job_id)]
            print(f"  job {job_id}'s stream (an attempt that runs again emits again): {items}")
        check(bool(self.killed), "a worker was killed between two paid steps")
        return self.verdict()


def run(url: str | None, jobs: int = 4) -> int:
    """Run the steps demo against ``url``, or an embedded PostgreSQL when it is None."""
    if jobs < 1:
        raise ConfigError("--documents (jobs) must be at least 1")
    return with_server(url, lambda u: StepsDemo(u, jobs).run())
