"""The registry of worker processes (``leaseq.workers``): each worker's row, kept fresh by its
heartbeat loop, and what the operator and the CLI read from it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from leaseq.core import validation
from leaseq.core._store.store import Store
from leaseq.core.db import Conn, Db, borrow
from leaseq.core.models import WorkerRecord, WorkerState

log = logging.getLogger("leaseq.queue")


class Workers:
    """The workers table over one connection or a pool; each call is one statement."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._store = Store()

    def register(
        self,
        worker_id: str,
        *,
        pod: str | None,
        node: str | None,
        queues: Sequence[str],
        concurrency: int,
        state: WorkerState,
        in_flight: int,
        startup_seconds: float | None = None,
        job_types: Sequence[str] | None = None,
        boot_at: datetime | None = None,
        now: datetime | None = None,
    ) -> None:
        """Insert this worker's row, or refresh its heartbeat, state, in-flight count,
        ``startup_seconds`` (how long on_startup took; None while loading), ``job_types``
        (those it claims; None: every type of its queues) and ``boot_at`` (when its process
        started, by its host's clock: what a container's termination time is compared with;
        None for an id another process may use after it, which is never reclaimed early)."""
        with borrow(self._db, "register worker") as c:
            self._store.worker_upsert(
                c,
                worker_id=worker_id,
                pod=pod,
                node=node,
                queues=queues,
                concurrency=concurrency,
                state=state,
                in_flight=in_flight,
                startup_seconds=startup_seconds,
                job_types=job_types,
                boot_at=boot_at,
                now=now,
            )

    def remove(self, worker_id: str) -> bool:
        """Delete the worker's row (on a clean exit); False when there was none."""
        with borrow(self._db, "remove worker") as c:
            return self._store.worker_delete(c, worker_id)

    def forget_silent(self, *, silent_for: float, now: datetime | None = None) -> list[str]:
        """Remove rows of workers silent for ``silent_for`` seconds (a SIGKILLed pod never
        deletes its own); their jobs, if any, are the reaper's. Returns their ids."""
        validation.positive("silent_for", silent_for)
        with borrow(self._db, "forget workers") as c:
            gone = self._store.worker_prune_stale(c, older_than=silent_for, now=now)
        for worker in gone:
            log.info("forgot silent worker", extra={"worker": worker})
        return gone

    def terminated(self, pod: str, node: str, finished_at: datetime, conn: Conn) -> list[str]:
        """The workers registered from ``pod`` on ``node`` whose process started before
        ``finished_at`` (by the node's clock, when the kubelet saw the pod's worker container
        terminate): they ran in that container, so none can still run. Joins ``conn``'s
        transaction (a reap pass's). Only a worker whose id is its process's own registers
        ``boot_at``, so no later process (a restarted container's) holds a lease under these
        ids."""
        with borrow(self._db, "find terminated workers", conn) as c:
            return self._store.worker_terminated(c, pod=pod, node=node, finished_at=finished_at)

    def list(self, queues: Sequence[str] | None = None) -> list[WorkerRecord]:
        """Registered workers (serving any of ``queues``, or all), with their running jobs."""
        with borrow(self._db, "list workers") as c:
            return self._store.worker_list(c, queues=queues)
