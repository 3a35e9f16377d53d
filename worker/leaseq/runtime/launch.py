"""A slot's child process, started with its parent-death signal set before its interpreter
starts.

``multiprocessing``'s ``spawn`` forks and executes the interpreter, which then starts up
(``site``, the environment's ``.pth`` files) and imports the worker's main module before any
leaseq code runs: seconds on a loaded host, during which a SIGKILLed worker would leave the
child running until its first ``import leaseq`` (:mod:`leaseq._orphans`). So the child is
started through util-linux's ``setpriv --pdeathsig KILL``, which asks Linux for the signal in
the forked process and then executes the interpreter: a parent-death signal survives the
``execve`` of a binary that is neither set-user-ID nor given capabilities, so it holds from the
interpreter's first instruction. A parent that died between the fork and ``setpriv``'s
``prctl`` is caught at the child's first ``import leaseq``, which checks that its parent is
still the worker (:func:`leaseq._orphans.die_with_parent`).

Where ``setpriv`` is missing (not Linux, an image without util-linux) a child starts as
``multiprocessing`` starts it, protected from its first ``import leaseq`` on.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Sequence
from multiprocessing import context, popen_spawn_posix, reduction, resource_tracker, spawn, util
from multiprocessing.process import BaseProcess

#: util-linux's setpriv (None where it is missing).
SETPRIV = shutil.which("setpriv")


def command(cmd: Sequence[str | bytes]) -> list[str | bytes]:
    """``cmd`` (a spawned interpreter's command line) run with the parent-death signal set
    to SIGKILL before it starts, where ``setpriv`` is there."""
    if SETPRIV is None:
        return list(cmd)
    return [SETPRIV, "--pdeathsig", "KILL", "--", *cmd]


class _Popen(popen_spawn_posix.Popen):
    """``spawn``'s launcher with :func:`command`'s prefix: CPython's own ``_launch``, which
    offers no hook for it, but for the marked line."""

    def _launch(self, process_obj: BaseProcess) -> None:
        # The fds the child inherits (spawn's Popen sets the list; DupFd adds to it).
        fds: list[int] = self._fds  # type: ignore[attr-defined]
        tracker_fd = resource_tracker.getfd()
        if tracker_fd is not None:
            fds.append(tracker_fd)
        prep_data = spawn.get_preparation_data(process_obj.name)
        fp = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            context.set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            fds.extend([child_r, child_w])
            argv = command(cmd)  # the one change
            self.pid = util.spawnv_passfds(os.fsencode(argv[0]), argv, fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            fds_to_close = [fd for fd in (parent_r, parent_w) if fd is not None]
            self.finalizer = util.Finalize(self, util.close_fds, fds_to_close)  # type: ignore[attr-defined]
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class ChildProcess(context.SpawnProcess):
    """A ``spawn`` process started through :func:`command`."""

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> _Popen:
        return _Popen(process_obj)
