"""Children of ``--isolation process`` die with their supervisor from their first import on.

A child is a fresh interpreter started by ``multiprocessing``'s ``spawn``, which imports the
worker's main module (the whole CLI) and unpickles its target before the child's own code
runs: seconds on a busy host, during which a SIGKILLed supervisor would leave it running.
The worker starts it with ``PR_SET_PDEATHSIG`` already set where it can
(:mod:`leaseq.runtime.launch`); the first ``import leaseq`` of such a child (named by
:data:`SUPERVISOR_ENV`, which the worker sets before it starts any thread) asks Linux for it
again at once, and exits if the worker died before either took effect. Stdlib only, so
nothing slow comes before it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: The supervisor's pid, set in the worker's environment for its children (they inherit it).
SUPERVISOR_ENV = "LEASEQ_SUPERVISOR_PID"
PR_SET_PDEATHSIG = 1


def die_with_parent(supervisor: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a SIGKILLed supervisor must
    not leave children holding GPUs); elsewhere EOF on the pipe does it, later.

    The parent is known by its pid, never assumed not to be 1: in a container the worker
    is PID 1 (the kubelet runs the entrypoint so), and an orphan is reparented to another
    process, so a parent pid that is no longer ``supervisor`` means the parent died
    (before ``prctl`` took effect)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != supervisor:
        os._exit(1)


def _at_import() -> None:
    """In a spawned child of a supervisor, die with it from now on. Spawned: ``spawn`` has
    put the parent's main module in place as ``__mp_main__`` before anything imports leaseq
    (any other process the supervisor's code may start is left alone). A process whose
    parent is not the supervisor (a handler's own subprocess inherits the variable) is left
    alone too, and the supervisor's child checks again once it runs."""
    supervisor = os.environ.get(SUPERVISOR_ENV, "")
    spawned = "__mp_main__" in sys.modules
    if spawned and supervisor.isdigit() and os.getppid() == int(supervisor):
        die_with_parent(int(supervisor))


_at_import()
