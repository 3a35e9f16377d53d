"""Which step of an attempt is open, so a drain never hands a job back while one runs.

A step is open from the moment its intent is about to be committed until its result is
recorded or its intent withdrawn: meanwhile its function (or ``reconcile`` check) may be
writing its effect. Were the job released then, another worker could reconcile the step
before that effect lands, find nothing, and run the function again: two effects. So the
worker (:meth:`leaseq.runtime.worker.Worker.drain`) closes the gate at the end of its drain
window, which lets no new step open, and releases the job only once no step is open.

The gate is kept where every step's store call passes: the worker-side
:class:`leaseq.runtime.context.JobContext` (for a child process too, whose calls its
supervisor makes on the attempt's context).
"""

from __future__ import annotations

import threading


class StepGate:
    """One attempt's open step (at most one: a handler runs its steps one after another)
    and whether new steps may still open. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: str | None = None
        self._closed = False

    def enter(self, name: str) -> bool:
        """Open step ``name`` before its intent is committed; False (nothing opened) once
        the gate is closed: the step must not start."""
        with self._lock:
            if self._closed:
                return False
            self._open = name
            return True

    def leave(self) -> None:
        """The open step ended: its result recorded, its intent withdrawn or not committed."""
        with self._lock:
            self._open = None

    def close(self) -> str | None:
        """Let no step open from now on; the step open now (None: none), which may still be
        writing its effect."""
        with self._lock:
            self._closed = True
            return self._open
