"""A peer runtime in its own virtual environment: DBOS Transact, Chancy or Oban for Python.

Run by :mod:`bench.external` with the peer's own interpreter, never imported by the project
(it imports only the standard library and the peer), so the project's dependencies stay as
they are. ``python peer_child.py COMMAND JSON``:

* ``install``: create the peer's schema in the database.
* ``reset``: empty the peer's tables (and declare the queue where the peer wants that first).
* ``enqueue``: enqueue ``jobs`` jobs of ``task`` (``noop`` or ``hold``, which sleeps
  ``seconds``); the parent runs it while every worker is ready and stopped (SIGSTOP), so
  no job runs before the start signal and no worker's start-up is timed.
* ``work``: start one worker process of the peer at ``setting`` (``default``, ``tuned`` or
  ``limit``), print ``ready``, wait for ``start`` on standard input, run until ``stop`` (or
  the end of standard input: the parent is gone), then print one JSON line with the CPU
  seconds this process and its reaped children spent from the start.
* ``wakes`` (DBOS only, :mod:`bench.wakes`): ``sparse`` workflows one at a time, then
  ``sleepers`` workflows started ``gap`` seconds apart, each ``DBOS.sleep(seconds)`` once;
  then ``signals`` workflows, one at a time, each waiting in ``DBOS.recv`` for a message
  ``DBOS.send`` sends ``pause`` seconds after it said it was ready; prints one JSON line:
  each sleep's lateness and each message's round trip, in seconds.

Every handler, in whatever process or thread the peer runs it, appends ``worker start end``
(wall clock) to ``$LEASEQ_PEER_STAMPS/<worker>-<pid>``: the parent times the run from the
start signal to the last completion, and measures the overlap of the limit scenario from
these timestamps, not from the peer's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

QUEUE = "bench"
# Chancy and Oban find a handler by its import path: this module, on their PYTHONPATH.
MODULE = "peer_child"

_fd: list[int] = []


def _stamp(started: float) -> None:
    ended = time.time()
    if not _fd:
        folder = os.environ["LEASEQ_PEER_STAMPS"]
        name = f"{os.environ['LEASEQ_PEER_WORKER']}-{os.getpid()}"
        _fd.append(os.open(Path(folder) / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    # One unbuffered write per job: a process the peer kills loses no stamp.
    os.write(_fd[0], f"{os.environ['LEASEQ_PEER_WORKER']} {started:.6f} {ended:.6f}\n".encode())


def noop() -> None:
    _stamp(time.time())


def hold(seconds: float) -> None:
    started = time.time()
    time.sleep(seconds)
    _stamp(started)


async def anoop() -> None:
    _stamp(time.time())


async def ahold(seconds: float) -> None:
    started = time.time()
    await asyncio.sleep(seconds)
    _stamp(started)


class NoopWorker:
    """Oban for Python's worker: a class with an async ``process``."""

    async def process(self, job: Any) -> None:
        _stamp(time.time())


class HoldWorker:
    async def process(self, job: Any) -> None:
        started = time.time()
        await asyncio.sleep(job.args["seconds"])
        _stamp(started)


class Control:
    """The parent's start and stop lines, read on a thread (a peer may block its loop)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.cpu0 = 0.0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            if line.strip() == "start":
                self.cpu0 = _cpu()
                self.started.set()
            elif line.strip() == "stop":
                break
        self.started.set()
        self.stopped.set()

    def ready(self) -> None:
        print("ready", flush=True)
        self.started.wait()

    def report(self) -> None:
        print(json.dumps({"cpu": _cpu() - self.cpu0}), flush=True)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


async def _wait_stop(control: Control) -> None:
    while not control.stopped.is_set():
        await asyncio.sleep(0.05)


# -- DBOS Transact ---------------------------------------------------------------------------


def _dbos_launch(cfg: dict[str, Any], executor_id: str) -> Any:
    from dbos import DBOS

    DBOS(
        config={
            "name": "leaseq-bench",
            "system_database_url": _sqlalchemy_url(cfg["url"]),
            "executor_id": executor_id,
            "log_level": "WARNING",
            # Four connections a process, as the other peers get: 16 processes stay under
            # the server's 100 connections.
            "sys_db_pool_size": 4,
        }
    )
    DBOS.workflow(name="noop")(noop)
    DBOS.workflow(name="hold")(hold)
    DBOS.launch()
    # https://docs.dbos.dev/python/reference/queues: `polling_interval_sec` (default 1.0 s)
    # is how often each process looks for queued workflows; `worker_concurrency` bounds one
    # process (so a process leaves work for the others), `global_concurrency` all of them.
    # A queue is registered after launch: its configuration lives in the system database.
    if cfg["setting"] == "default":
        DBOS.register_queue(QUEUE, on_conflict="always_update")
    elif cfg["setting"] == "tuned":
        DBOS.register_queue(
            QUEUE,
            worker_concurrency=cfg["batch"] or None,
            polling_interval_sec=cfg["poll"],
            on_conflict="always_update",
        )
    else:
        DBOS.register_queue(
            QUEUE,
            global_concurrency=cfg["batch"],
            polling_interval_sec=cfg["poll"],
            on_conflict="always_update",
        )
    return DBOS


def _sqlalchemy_url(url: str) -> str:
    """The server as SQLAlchemy names it; ``url`` may be a URI or key=value pairs (a Unix
    socket's directory goes in the query, where psycopg reads it)."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import URL

    parts = conninfo_to_dict(url)
    sqlalchemy_url = URL.create(
        "postgresql+psycopg",
        username=parts.get("user"),
        password=parts.get("password"),
        port=int(parts["port"]) if parts.get("port") else None,
        database=parts.get("dbname"),
        query={"host": str(parts["host"])} if parts.get("host") else {},
    )
    return sqlalchemy_url.render_as_string(hide_password=False)


def dbos_wakes(cfg: dict[str, Any]) -> None:
    """The ``wakes`` command: DBOS's workflows run in the process that starts them, its
    usual shape, so this one process is both the producer and the worker."""
    from dbos import DBOS

    def nap(seconds: float) -> float:
        began = time.time()
        DBOS.sleep(seconds)
        return time.time() - began - seconds

    def await_go() -> float:
        DBOS.set_event("ready", True)
        message = DBOS.recv("go", timeout_seconds=120)
        return time.time() - float(message["sent"])

    DBOS(
        config={
            "name": "leaseq-bench",
            "system_database_url": _sqlalchemy_url(cfg["url"]),
            "executor_id": "wakes",
            "log_level": "WARNING",
        }
    )
    DBOS.workflow(name="nap")(nap)
    DBOS.workflow(name="await_go")(await_go)
    DBOS.launch()
    try:
        alone = [float(DBOS.start_workflow(nap, cfg["seconds"]).get_result())
                 for _ in range(cfg["sparse"])]  # fmt: skip
        handles = []
        for _ in range(cfg["sleepers"]):
            handles.append(DBOS.start_workflow(nap, cfg["seconds"]))
            time.sleep(cfg["gap"])
        late = [float(h.get_result()) for h in handles]
        trips = []
        for _ in range(cfg["signals"]):
            handle = DBOS.start_workflow(await_go)
            DBOS.get_event(handle.workflow_id, "ready", timeout_seconds=60)
            time.sleep(cfg["pause"])
            DBOS.send(handle.workflow_id, {"sent": time.time()}, "go")
            trips.append(float(handle.get_result()))
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=0)
    found = {"sleep_late_sparse": alone, "sleep_late_busy": late, "signal_trip": trips}
    print(json.dumps(found), flush=True)


def dbos_command(command: str, cfg: dict[str, Any]) -> None:
    if command == "wakes":
        dbos_wakes(cfg)
        return
    if command == "install":
        dbos = _dbos_launch({**cfg, "setting": "default"}, "install")  # launch migrates
        dbos.destroy()
        return
    if command == "reset":
        import psycopg

        # The queue's configuration is in the database, and a process applies a change one
        # poll late: stored here, before any worker launches, each starts with this one.
        dbos = _dbos_launch(cfg, "setup")
        with psycopg.connect(cfg["url"], autocommit=True) as conn:
            conn.execute("TRUNCATE dbos.workflow_status CASCADE")
        dbos.destroy()
        return
    if command == "enqueue":
        from dbos import DBOSClient

        client = DBOSClient(system_database_url=_sqlalchemy_url(cfg["url"]))
        args = (cfg["seconds"],) if cfg["task"] == "hold" else ()
        engine = client._sys_db.engine
        for start in range(0, cfg["jobs"], 1000):
            # One transaction per thousand, as the other peers enqueue in batches.
            with engine.begin() as conn:
                for _ in range(min(1000, cfg["jobs"] - start)):
                    client.enqueue_in_transaction(
                        conn, {"queue_name": QUEUE, "workflow_name": cfg["task"]}, *args
                    )
        client.destroy()
        return
    control = Control()
    dbos = _dbos_launch(cfg, cfg["worker"])
    control.ready()
    control.stopped.wait()
    control.report()
    dbos.destroy(workflow_completion_timeout_sec=0)


# -- Chancy ----------------------------------------------------------------------------------


def _chancy_queue(cfg: dict[str, Any]) -> Any:
    from chancy import Chancy, Queue

    # https://tkte.github.io/chancy/chancy.queue.html: `concurrency` is per worker (default:
    # the worker's core count), the default executor is a process pool, `polling_interval`
    # is 5 s by default and `eager_polling` polls again as soon as a job completes; the
    # AsyncExecutor runs many IO-bound jobs in the worker's own event loop.
    if cfg["setting"] == "default":
        return Queue(QUEUE)
    return Queue(
        QUEUE,
        concurrency=cfg["batch"],
        executor=Chancy.Executor.Async,
        polling_interval=1,
        eager_polling=True,
    )


def chancy_command(command: str, cfg: dict[str, Any]) -> None:
    from chancy import Chancy, Job, Worker
    from chancy.app import setup_default_logger

    async def main() -> None:
        # Chancy logs every job at INFO by default; the other runtimes here log none.
        log = setup_default_logger(logging.WARNING)
        async with Chancy(cfg["url"], max_connection_pool_size=4, log=log) as chancy:
            if command == "install":
                await chancy.migrate()
                return
            if command == "reset":
                async with chancy.pool.connection() as conn:
                    await conn.execute("TRUNCATE chancy_jobs")
                await chancy.declare(_chancy_queue(cfg), upsert=True)
                return
            if command == "enqueue":
                asynchronous = cfg["setting"] != "default"
                name = ("a" if asynchronous else "") + cfg["task"]
                kwargs = {"seconds": cfg["seconds"]} if cfg["task"] == "hold" else {}
                job = Job(func=f"{MODULE}.{name}", queue=QUEUE, kwargs=kwargs)
                for start in range(0, cfg["jobs"], 1000):
                    async for _ in chancy.push_many([job] * min(1000, cfg["jobs"] - start)):
                        pass
                return
            control = Control()
            async with Worker(
                chancy, worker_id=cfg["worker"], register_signal_handlers=False
            ) as worker:
                # Ready once the queue is known to the worker, so the start is the start.
                while QUEUE not in worker._queues:
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(control.ready)
                await _wait_stop(control)
                control.report()
                await worker.stop(timeout=0)

    asyncio.run(main())


# -- Oban for Python -------------------------------------------------------------------------


def oban_command(command: str, cfg: dict[str, Any]) -> None:
    from oban import Job, Oban
    from oban.schema import install
    from psycopg_pool import AsyncConnectionPool

    async def main() -> None:
        async with AsyncConnectionPool(cfg["url"], min_size=1, max_size=4, open=False) as pool:
            if command == "install":
                await install(pool)
                return
            if command == "reset":
                async with pool.connection() as conn:
                    await conn.execute("TRUNCATE oban_jobs")
                return
            if command == "enqueue":
                oban = Oban(pool=pool)
                worker = f"{MODULE}.{'HoldWorker' if cfg['task'] == 'hold' else 'NoopWorker'}"
                args = {"seconds": cfg["seconds"]} if cfg["task"] == "hold" else {}
                for start in range(0, cfg["jobs"], 1000):
                    n = min(1000, cfg["jobs"] - start)
                    await oban.enqueue_many([Job(worker, queue=QUEUE, args=args) for _ in range(n)])
                return
            control = Control()
            # https://oban.pro/docs/py: `queues` maps a queue to its limit of concurrent jobs
            # on this node (a local limit, as in Oban for Elixir, whose global limits are an
            # Oban Pro feature). No limit is the default: 10 is the one its examples use.
            oban = Oban(pool=pool, node=cfg["worker"], queues={QUEUE: cfg["batch"]})
            await oban.start()
            await asyncio.to_thread(control.ready)
            await _wait_stop(control)
            control.report()
            await oban.stop()

    asyncio.run(main())


COMMANDS = {"dbos": dbos_command, "chancy": chancy_command, "oban": oban_command}


def main() -> None:
    command, raw = sys.argv[1], sys.argv[2]
    cfg = json.loads(raw)
    COMMANDS[cfg["peer"]](command, cfg)


if __name__ == "__main__":
    main()
