"""Running W worker processes that start together, and measuring the CPU they and the machine use.

Workers are real processes (a forkserver child each), so W workers are W PostgreSQL sessions
and W Python interpreters competing for the same cores as the server, as in production.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, Generic, TypeVar

A = TypeVar("A")
R = TypeVar("R")

_TICK = os.sysconf("SC_CLK_TCK")
_CONTEXT = multiprocessing.get_context("forkserver")


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores, all processes) since boot."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one live process (0 when it has already gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def wait_reaped(pid: int, timeout: float = 30.0) -> None:
    """Return once process ``pid`` is gone from /proc (exited and reaped), or after ``timeout``.

    A server meter reads a backend's CPU while it lives and, once its postmaster has reaped
    it, among the postmaster's children's times. A backend that has been told to close but
    has not been reaped yet is in neither, and its whole CPU lands in the next interval
    measured: a 100,000-job enqueue's backend added up to 0.8 ms per job to a drain after it.
    """
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def server_cpu_meter(url: str) -> Callable[[], float] | None:
    """A reader of the CPU seconds used so far by a PostgreSQL server on this machine: the
    postmaster, its reaped children (exited backends) and its live children. None when the
    server's processes are not visible here (a remote server)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
        ).fetchone()
    fields = _stat_fields(row[0]) if row else None
    if fields is None:
        return None
    postmaster = fields[1]

    def read() -> float:
        own = _stat_fields(postmaster)
        if own is None:
            return 0.0
        ticks = sum(int(f) for f in own[11:15])  # utime, stime, cutime, cstime
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                child = _stat_fields(entry.name)
                if child is not None and child[1] == postmaster:
                    ticks += int(child[11]) + int(child[12])
        return ticks / _TICK

    return read


class Signals:
    """What a worker sees of the gang: announce readiness (then wait for the start), and ask
    whether the gang is stopping."""

    def __init__(self, ready: Any, start: Event, stop: Event) -> None:
        self._ready = ready
        self._start = start
        self._stop = stop
        self.cpu_at_start = 0.0

    def ready(self) -> None:
        """Say set-up is done, then block until every worker is ready and the run starts."""
        self._ready.put(os.getpid())
        self._start.wait()
        self.cpu_at_start = _own_cpu_seconds()

    def stopping(self) -> bool:
        return self._stop.is_set()


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _child(
    target: Callable[[Any, Signals], Any],
    arg: Any,
    index: int,
    ready: Any,
    start: Event,
    stop: Event,
    results: Any,
) -> None:
    signals = Signals(ready, start, stop)
    try:
        outcome: Any = target(arg, signals)
        results.put((index, outcome, None, _own_cpu_seconds() - signals.cpu_at_start))
    except BaseException as exc:
        results.put((index, None, f"{type(exc).__name__}: {exc}", 0.0))
        raise


@dataclass(frozen=True)
class GangRun(Generic[R]):
    """One run: each worker's return value (in argument order), the wall time from the start
    signal to the end, and the CPU seconds the workers and the whole machine spent meanwhile."""

    results: list[R]
    seconds: float
    client_cpu: float
    machine_cpu: float
    server_cpu: float | None


def run_gang(
    target: Callable[[A, Signals], R],
    args: Sequence[A],
    *,
    until: Callable[[], bool] | None = None,
    poll: float = 0.02,
    timeout: float = 900.0,
    server_cpu: Callable[[], float] | None = None,
    before_start: Callable[[], object] | None = None,
) -> GangRun[R]:
    """Start one process per argument, release them together once all are ready, and wait.

    Without ``until`` the run ends when every worker has returned. With it, the run ends when
    ``until()`` first returns true (polled every ``poll`` seconds); workers are then asked to
    stop and are terminated if they do not return within a few seconds. ``server_cpu`` (see
    :func:`server_cpu_meter`) is read at the start and the end. ``before_start`` runs once
    every worker is ready, before the start signal and outside the measured time. Raises
    RuntimeError
    when a worker fails or the run exceeds ``timeout`` seconds.
    """
    ready, results = _CONTEXT.Queue(), _CONTEXT.Queue()
    start, stop = _CONTEXT.Event(), _CONTEXT.Event()
    procs = [
        _CONTEXT.Process(target=_child, args=(target, arg, i, ready, start, stop, results))
        for i, arg in enumerate(args)
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            _get(ready, procs, results, timeout=120.0, what="ready")
        if before_start is not None:
            before_start()
        cpu0 = {p.pid: process_cpu_seconds(p.pid or 0) for p in procs}
        machine0 = machine_cpu_seconds()
        server0 = server_cpu() if server_cpu else 0.0
        t0 = time.perf_counter()
        start.set()
        collected: dict[int, Any] = {}
        if until is not None:
            while not until():
                if time.perf_counter() - t0 > timeout:
                    raise RuntimeError(f"run did not finish within {timeout:.0f} s")
                _raise_failures(results, collected)
                time.sleep(poll)
            seconds = time.perf_counter() - t0
            client = sum(process_cpu_seconds(p.pid or 0) - cpu0[p.pid] for p in procs)
            machine = machine_cpu_seconds() - machine0
            server = server_cpu() - server0 if server_cpu else None
            stop.set()
            deadline = time.perf_counter() + 10.0
            while len(collected) < len(procs) and time.perf_counter() < deadline:
                _collect(results, collected, wait=0.2)
                if all(not p.is_alive() for p in procs):
                    _collect(results, collected, wait=0.2)
                    break
        else:
            while len(collected) < len(procs):
                if time.perf_counter() - t0 > timeout:
                    raise RuntimeError(f"run did not finish within {timeout:.0f} s")
                _raise_failures(results, collected)
                _collect(results, collected, wait=poll)
            seconds = time.perf_counter() - t0
            # Each worker measured its own CPU from the start signal to its return.
            client = sum(cpu for _, _, cpu in collected.values())
            machine = machine_cpu_seconds() - machine0
            server = server_cpu() - server0 if server_cpu else None
        failures = [f"worker {i}: {err}" for i, (_, err, _) in sorted(collected.items()) if err]
        if failures:
            raise RuntimeError("; ".join(failures))
        return GangRun(
            results=[collected[i][0] for i in sorted(collected)],
            seconds=seconds,
            client_cpu=client,
            machine_cpu=machine,
            server_cpu=server,
        )
    finally:
        stop.set()
        start.set()
        for proc in procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _get(source: Any, procs: Sequence[Any], results: Any, *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return source.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if not p.is_alive() and p.exitcode not in (None, 0)]
            if dead:
                _raise_failures(results, {})
                raise RuntimeError(
                    f"a worker exited with code {dead[0].exitcode} before {what}"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers were not {what} within {timeout:.0f} s") from None


def _collect(source: Any, collected: dict[int, Any], *, wait: float) -> None:
    try:
        index, value, error, cpu = source.get(timeout=wait) if wait > 0 else source.get_nowait()
    except queue.Empty:
        return
    collected[index] = (value, error, cpu)
    while True:
        try:
            index, value, error, cpu = source.get_nowait()
        except queue.Empty:
            return
        collected[index] = (value, error, cpu)


def _raise_failures(source: Any, collected: dict[int, Any]) -> None:
    _collect(source, collected, wait=0.0)
    errors = [err for _, err, _ in collected.values() if err]
    if errors:
        raise RuntimeError(errors[0])


def cpu_per_job(run: GangRun[Any], jobs: int) -> dict[str, float | str]:
    """CSV columns: CPU milliseconds per job spent by the workers, by the server (empty when
    it is not on this machine) and by the whole machine (which includes anything else that
    was running)."""
    per = 1000.0 / max(jobs, 1)
    return {
        "client_cpu_ms_per_job": round(run.client_cpu * per, 3),
        "server_cpu_ms_per_job": "" if run.server_cpu is None else round(run.server_cpu * per, 3),
        "machine_cpu_ms_per_job": round(run.machine_cpu * per, 3),
    }
