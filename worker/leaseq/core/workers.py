"""The registry of worker processes (``leaseq.workers``): each worker's row, kept fresh by its
heartbeat loop, and what the operator and the CLI read from it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from leaseq.core import validation
from leaseq.core._store.store import Store
from leaseq.core.db import Db, borrow
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
        now: datetime | None = None,
    ) -> None:
        """Insert this worker's row, or refresh its heartbeat, state, in-flight count,
        ``startup_seconds`` (how long on_startup took; None while loading) and ``job_types``
        (those it claims; None: every type of its queues)."""
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

    def list(self, queues: Sequence[str] | None = None) -> list[WorkerRecord]:
        """Registered workers (serving any of ``queues``, or all), with their running jobs."""
        with borrow(self._db, "list workers") as c:
            return self._store.worker_list(c, queues=queues)
