"""Runs claimers on threads and checks the executions: the duplicate detector of the crash list."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

# A claim function: given a connection and a worker name, lease one job and return
# (job_id, lease token) or None when nothing is left.
ClaimFn = Callable[[psycopg.Connection[tuple[object, ...]], str], tuple[int, int] | None]


@dataclass(frozen=True)
class Executions:
    """What a run of claimers did: one (job_id, token) per execution of a job."""

    runs: list[tuple[int, int]]

    @property
    def duplicates(self) -> int:
        """Executions beyond the first of each job."""
        return len(self.runs) - len({job for job, _ in self.runs})

    @property
    def duplicate_tokens(self) -> int:
        """(job, token) pairs handed out more than once: a broken lease."""
        return sum(n - 1 for n in Counter(self.runs).values() if n > 1)


def run_claimers(
    url: str,
    threads: int,
    claim: ClaimFn,
    *,
    rounds: int | None = None,
    barrier: threading.Barrier | None = None,
) -> Executions:
    """Each thread claims until the queue is empty (or for ``rounds`` claims) on its own
    connection; every execution is recorded."""
    runs: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                done = 0
                while rounds is None or done < rounds:
                    got = claim(conn, f"w{n}")
                    if barrier is not None:
                        barrier.wait(timeout=30)
                    if got is None:
                        return
                    with lock:
                        runs.append(got)
                    done += 1
        except BaseException as exc:  # surfaced below, not swallowed
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return Executions(runs)
