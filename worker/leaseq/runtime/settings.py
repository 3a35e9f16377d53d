"""``leaseq worker`` settings: flags with ``LEASEQ_*`` fallbacks, validated once at start-up."""

from __future__ import annotations

import argparse
import enum
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from leaseq import config as settings
from leaseq.config import Option
from leaseq.core import validation
from leaseq.core.errors import ConfigError, InvalidJob
from leaseq.core.models import DEFAULT_LEASE_SECONDS
from leaseq.runtime.leading import LEASE_TTL_SECONDS


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


class Isolation(enum.StrEnum):
    """Where handlers run. THREAD (the default): threads of the worker process, which share
    its memory and GIL with the heartbeat; cheap, and right for handlers that wait on I/O
    or release the GIL. PROCESS: one child process per slot, supervised by the worker
    process, which keeps the leases; for handlers that hold the GIL in C calls, may crash,
    leak, or hold a GPU that only a killed process gives back. It costs a process per slot
    (``on_startup`` runs in each: one model copy per slot) and a pipe hop per message."""

    THREAD = "thread"
    PROCESS = "process"


APP = Option("app", "LEASEQ_APP", str, None, "handler registry to load, as package.module:name")
QUEUES = Option(
    "queue",
    "LEASEQ_QUEUES",
    settings.csv_list,
    None,
    "queue to serve; repeat the flag (the variable takes a comma list)",
    repeat=True,
)
#: Most slots one worker process runs. Every slot is a thread (or a child process and its
#: guard), may hold one of the process's pool connections while it settles (the pool opens
#: up to concurrency + 4, against PostgreSQL's default max_connections of 100), and is
#: renewed by the one heartbeat loop, one statement per lease; a claim takes at most
#: MAX_CLAIM_BATCH (100) jobs per statement. Past a few hundred slots one process is the
#: bottleneck: more replicas scale, and the operator adds them. 1024 leaves room for I/O-bound
#: handlers and still fails fast on a typo such as 100000 (which would start 100,000 threads).
MAX_CONCURRENCY = 1024
CONCURRENCY = Option(
    "concurrency",
    "LEASEQ_CONCURRENCY",
    settings.positive_int,
    1,
    "slots: jobs (or batches) run at once (threads or child processes, see --isolation); "
    f"at most {MAX_CONCURRENCY}",
)
ISOLATION = Option(
    "isolation",
    "LEASEQ_ISOLATION",
    settings.choice(*Isolation),
    Isolation.THREAD.value,
    "where handlers run: thread (threads of the worker process) or process (a child process "
    "per slot, killed at max runtime, on cancel or on a lost lease; a crash fails only its "
    "attempt)",
)
DRAIN_SECONDS = Option(
    "drain_seconds",
    "LEASEQ_DRAIN_SECONDS",
    settings.non_negative_float,
    25.0,
    "on SIGTERM, how long in-flight jobs may finish before they are released (a job inside "
    "a durable step once its step ends); keep it below the pod's "
    "terminationGracePeriodSeconds",
)
LEASE_SECONDS = Option(
    "lease_seconds",
    "LEASEQ_LEASE_SECONDS",
    settings.positive_float,
    DEFAULT_LEASE_SECONDS,
    "lease length: how long a crashed worker's job waits before the reaper takes it back; "
    "when the crashed worker was the elected leader (--lead), the reaper itself waits for "
    f"the leader lease ({LEASE_TTL_SECONDS:g} s) to lapse and another process to lead "
    "first, so its jobs come back after the longer of the two plus a reaper pass",
)
#: Renewals per lease when --heartbeat-seconds is not given: a lease survives two missed
#: renewals (the 30 s default lease is renewed every 10 s).
HEARTBEATS_PER_LEASE = 3
HEARTBEAT_SECONDS = Option(
    "heartbeat_seconds",
    "LEASEQ_HEARTBEAT_SECONDS",
    settings.positive_float,
    None,
    "how often leases are renewed; must be below the lease",
    default_shown=f"1/{HEARTBEATS_PER_LEASE} of --lease-seconds",
)
POLL_SECONDS = Option(
    "poll_seconds",
    "LEASEQ_POLL_SECONDS",
    settings.positive_float,
    5.0,
    "longest idle wait between claims when no notification arrives",
)
LISTEN = Option(
    "listen",
    "LEASEQ_LISTEN",
    boolean,
    True,
    "true or false: LISTEN for enqueue notifications (set false behind a transaction-pooling "
    "PgBouncer; polling alone still drains every job)",
)
PREPARED_STATEMENTS = Option(
    "prepared_statements",
    "LEASEQ_PREPARED_STATEMENTS",
    boolean,
    True,
    "use server-side prepared statements (set false behind a transaction-pooling PgBouncer "
    "older than 1.21, which cannot carry them)",
)
LEAD = Option(
    "lead",
    "LEASEQ_LEAD",
    boolean,
    True,
    "true or false: take the leader lease when no operator, `leaseq reaper` or other worker "
    "holds it, and then reap, tick schedules and move history (needs the operator's database "
    "privileges; set false where an operator runs: its leader also scales)",
)
WORKER_ID = Option(
    "worker_id",
    "LEASEQ_WORKER_ID",
    str,
    None,
    "this process's name in leases (hostname-pid-random)",
)
POD_NAME = Option("pod_name", "LEASEQ_POD_NAME", str, None, "Kubernetes pod (downward API)")
NODE_NAME = Option("node_name", "LEASEQ_NODE_NAME", str, None, "Kubernetes node (downward API)")
METRICS_PORT = settings.METRICS_PORT

OPTIONS = [
    settings.DATABASE_URL,
    APP,
    QUEUES,
    CONCURRENCY,
    ISOLATION,
    DRAIN_SECONDS,
    LEASE_SECONDS,
    HEARTBEAT_SECONDS,
    POLL_SECONDS,
    LISTEN,
    PREPARED_STATEMENTS,
    LEAD,
    WORKER_ID,
    POD_NAME,
    NODE_NAME,
    METRICS_PORT,
    settings.METRICS_ADDRESS,
    settings.LOG_LEVEL,
    settings.LOG_FORMAT,
]


@dataclass(frozen=True)
class WorkerSettings:
    """Everything one worker process needs, checked for consistency."""

    database_url: str
    app: str
    queues: tuple[str, ...]
    concurrency: int = 1
    isolation: Isolation = Isolation.THREAD
    drain_seconds: float = 25.0
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    heartbeat_seconds: float = DEFAULT_LEASE_SECONDS / HEARTBEATS_PER_LEASE
    poll_seconds: float = 5.0
    listen: bool = True
    prepared_statements: bool = True
    lead: bool = True
    worker_id: str = ""
    pod_name: str | None = None
    node_name: str | None = None
    #: None: a free port (the default outside a pod); 0: no HTTP endpoints.
    metrics_port: int | None = 9100
    metrics_address: str = "0.0.0.0"  # noqa: S104 - see config.METRICS_ADDRESS
    log_level: str = "INFO"
    log_format: str = "text"
    #: True when ``worker_id`` was made for this process (not given): no other process,
    #: a restarted container's included, ever holds a lease under it.
    own_id: bool = False

    def __post_init__(self) -> None:
        if self.concurrency > MAX_CONCURRENCY:
            raise ConfigError(
                f"--concurrency {self.concurrency} is above the limit of {MAX_CONCURRENCY} "
                "slots per worker process; run more worker processes (replicas) instead"
            )
        if not self.queues:
            raise ConfigError("--queue is required (or set LEASEQ_QUEUES)")
        for queue in self.queues:
            try:
                validation.queue_name(queue)
            except InvalidJob as exc:
                raise ConfigError(f"--queue {queue!r}: {exc.problem}") from None
        if self.lease_seconds > validation.MAX_LEASE_SECONDS:
            raise ConfigError(
                f"--lease-seconds {self.lease_seconds:g} is above a day "
                f"({validation.MAX_LEASE_SECONDS}): a lease is renewed by heartbeats, so a "
                "long job needs no longer lease"
            )
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ConfigError(
                f"--heartbeat-seconds ({self.heartbeat_seconds}) must be below --lease-seconds "
                f"({self.lease_seconds}), or every lease expires between renewals"
            )
        if not self.worker_id:
            # The random part makes each process's id its own: in a container the worker is
            # PID 1 every time, and a restarted container's leases must never be taken for
            # those of the one that terminated.
            worker_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
            object.__setattr__(self, "worker_id", worker_id)
            object.__setattr__(self, "own_id", True)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> WorkerSettings:
        """Flags, else ``LEASEQ_*`` variables, else defaults; ConfigError on a bad value."""
        values = settings.resolve(args, OPTIONS, environ)
        heartbeat = values["heartbeat_seconds"]
        if heartbeat is None:
            heartbeat = values["lease_seconds"] / HEARTBEATS_PER_LEASE
        return cls(
            database_url=settings.require(values, settings.DATABASE_URL),
            app=settings.require(values, APP),
            queues=tuple(dict.fromkeys(settings.require(values, QUEUES))),
            concurrency=values["concurrency"],
            isolation=Isolation(values["isolation"]),
            drain_seconds=values["drain_seconds"],
            lease_seconds=values["lease_seconds"],
            heartbeat_seconds=heartbeat,
            poll_seconds=values["poll_seconds"],
            listen=values["listen"],
            prepared_statements=values["prepared_statements"],
            lead=values["lead"],
            worker_id=values["worker_id"] or "",
            pod_name=values["pod_name"],
            node_name=values["node_name"],
            metrics_port=values["metrics_port"],
            metrics_address=values["metrics_address"],
            log_level=values["log_level"],
            log_format=values["log_format"],
        )
