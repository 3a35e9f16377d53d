"""Failover chaos: a worker fleet on a Patroni cluster whose primary is killed again and again.

``python -m bench.failover_chaos [--kills N] [--results FOLDER]`` (numbers, not assertions;
needs Debian's patroni, etcd-server and postgresql-15; run as root, the servers run as the
``postgres`` user). It starts etcd and two Patroni nodes of PostgreSQL 15 (asynchronous
replication), migrates leaseq on the leader, and runs a producer (enqueues with idempotency
keys, retried until acknowledged), a reaper and ``leaseq worker`` processes, all on one
multi-host URL with ``target_session_attrs=read-write``. Each kill SIGKILLs the leader's
Patroni and postmaster (the node dies); Patroni promotes the other node once the leader key
expires, and the killed node is started again and rejoins as a replica before the next kill.
Every execution appends ``job token`` to a log file outside the database. Counted:

* lost jobs: acknowledged enqueues missing on the last primary (an asynchronous failover may
  lose the last ones; 0 for enqueues that replicated);
* executions per job, and (job, token) pairs executed twice: a token handed out twice (0);
* attempts spent; seconds from each kill to the first claim on the new primary.

Writes ``failover_chaos.csv`` (one row per kill) and ``failover_chaos_summary.csv``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import leaseq

BIN = "/usr/lib/postgresql/15/bin"
QUEUE = "chaos"
registry = leaseq.Registry()


@registry.job("effect")
def effect(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """Record this execution outside the database, then work ``seconds``."""
    with open(payload["log"], "a") as log:
        log.write(f"{ctx.job_id} {ctx.lease_token}\n")
    if ctx.wait(float(payload["seconds"])):
        raise leaseq.Interrupted("told to stop")
    return {"token": ctx.lease_token}


def as_postgres(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups", *cmd],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


class Cluster:
    """etcd and two Patroni nodes of PostgreSQL 15 under ``root``."""

    PORTS = ((54331, 18018), (54332, 18019))

    def __init__(self, root: Path) -> None:
        self.root = root
        os.chown(root, *_postgres_ids())
        self.etcd = as_postgres(
            ["etcd", "--data-dir", str(root / "etcd"),
             "--listen-client-urls", "http://127.0.0.1:23791",
             "--advertise-client-urls", "http://127.0.0.1:23791",
             "--listen-peer-urls", "http://127.0.0.1:23801"],
            root / "etcd.log",
        )  # fmt: skip
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        for n, (pg, api) in enumerate(self.PORTS, 1):
            config = root / f"n{n}.yml"
            config.write_text(_patroni_config(root, n, pg, api))
            os.chown(config, *_postgres_ids())
            self.start(f"n{n}")
        self.wait_healthy()

    def start(self, name: str) -> None:
        self.nodes[name] = as_postgres(
            ["patroni", str(self.root / f"{name}.yml")], self.root / f"patroni-{name}.log"
        )

    def members(self) -> list[dict[str, Any]]:
        out = subprocess.run(
            ["patronictl", "-c", str(self.root / "n1.yml"), "list", "-f", "json"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        try:
            return list(json.loads(out.stdout or "[]"))
        except json.JSONDecodeError:
            return []

    def wait_healthy(self, timeout: float = 120) -> None:
        """Until there is a leader and a streaming replica on the leader's timeline."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            members = self.members()
            roles = sorted(m.get("Role", "") for m in members)
            states = {m.get("State") for m in members}
            timelines = {m.get("TL") for m in members}
            if (
                roles == ["Leader", "Replica"]
                and states <= {"running", "streaming"}
                and len(timelines) == 1
            ):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the cluster did not become healthy: {self.members()}")

    def leader(self) -> str:
        for member in self.members():
            if member.get("Role") == "Leader":
                return str(member["Member"])
        raise RuntimeError("no leader")

    def kill(self, name: str) -> None:
        """The node dies: its Patroni and its postmaster, SIGKILL."""
        pid_file = self.root / name / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        self.nodes[name].send_signal(signal.SIGKILL)
        self.nodes[name].wait()
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGKILL)

    def url(self, dbname: str) -> str:
        hosts = ",".join(f"127.0.0.1:{pg}" for pg, _ in self.PORTS)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write&connect_timeout=2"

    def close(self) -> None:
        for proc in [*self.nodes.values(), self.etcd]:
            proc.send_signal(signal.SIGKILL)
        for n in range(1, len(self.PORTS) + 1):
            pid_file = self.root / f"n{n}" / "postmaster.pid"
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)


def _postgres_ids() -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


def _patroni_config(root: Path, n: int, pg: int, api: int) -> str:
    return f"""scope: leaseq-chaos
name: n{n}
restapi: {{listen: 127.0.0.1:{api}, connect_address: 127.0.0.1:{api}}}
etcd3: {{hosts: 127.0.0.1:23791}}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1073741824
    postgresql:
      use_pg_rewind: true
      parameters: {{wal_level: replica, hot_standby: "on", max_wal_senders: 5,
                   max_replication_slots: 5, wal_log_hints: "on", max_connections: 100}}
  initdb: [{{encoding: UTF8}}, {{auth: trust}}]
  pg_hba: ["host replication all 127.0.0.1/32 trust", "host all all 127.0.0.1/32 trust",
           "local all all trust"]
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {root}/n{n}
  bin_dir: {BIN}
  pgpass: {root}/pgpass{n}
  authentication: {{superuser: {{username: postgres}}, replication: {{username: postgres}},
                   rewind: {{username: postgres}}}}
  parameters: {{unix_socket_directories: '{root}'}}
"""


class Producer(threading.Thread):
    """Enqueues one job every ``interval`` seconds, each retried under its idempotency key
    until acknowledged."""

    def __init__(self, url: str, log: Path, seconds: float, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.log, self.seconds, self.interval = url, log, seconds, interval
        self.acknowledged: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.wait(self.interval):
            key = f"chaos-{n}"
            while not self.stop.is_set():
                try:
                    with leaseq.connect(self.url, action="enqueue") as conn:
                        leaseq.Queue(conn).enqueue(
                            QUEUE, "effect", {"log": str(self.log), "seconds": self.seconds},
                            idempotency_key=key,
                        )  # fmt: skip
                    self.acknowledged.append(key)
                    break
                # A commit cut by the kill can surface untranslated (psycopg's error): its
                # outcome is unknown either way, and the key makes the retry safe.
                except (leaseq.LeaseqError, psycopg.Error):
                    time.sleep(0.2)
            n += 1


class Reaper(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                with leaseq.connect(self.url, action="reap") as conn:
                    leaseq.Queue(conn).reap()
            except leaseq.LeaseqError:
                pass


def first_claim_after(url: str, since: float, timeout: float = 90) -> float | None:
    """Seconds from ``since`` (Unix time) to the first claim the new primary recorded."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT extract(epoch FROM min(started_at)) FROM leaseq.jobs"
                    " WHERE started_at > to_timestamp(%s)",
                    (since,),
                ).fetchone()
            if row and row[0] is not None:
                return float(row[0]) - since
        except psycopg.Error:
            pass
        time.sleep(0.2)
    return None


def run(kills: int, workers: int, folder: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="leaseq-chaos-"))
    log = root / "executions.log"
    log.touch()
    os.chmod(root, 0o777)
    os.chmod(log, 0o666)
    cluster = Cluster(root)
    url = cluster.url("postgres")
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[dict[str, Any]] = []
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("CREATE DATABASE leaseq")
        url = cluster.url("leaseq")
        with leaseq.connect(url, action="migrate") as conn:
            leaseq.migrate(conn)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        for w in range(workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "leaseq.cli", "worker", "--database-url", url,
                 "--app", "bench.failover_chaos:registry", "--queue", QUEUE,
                 "--worker-id", f"chaos-{w}", "--concurrency", "4", "--metrics-port", "0",
                 "--lease-seconds", "5", "--heartbeat-seconds", "1", "--poll-seconds", "0.2",
                 "--log-level", "WARNING"],
                env=env, stdout=(root / f"worker-{w}.log").open("ab"), stderr=subprocess.STDOUT,
            ))  # fmt: skip
        producer = Producer(url, log, seconds=0.5, interval=0.05)
        reaper = Reaper(url)
        producer.start()
        reaper.start()
        time.sleep(5)
        for k in range(kills):
            victim = cluster.leader()
            cluster.kill(victim)
            # After the postmaster's death: nothing commits on the victim any more.
            killed_at = time.time()
            claim_s = first_claim_after(url, killed_at)
            new_leader = cluster.leader()
            cluster.start(victim)
            cluster.wait_healthy()
            seconds = None if claim_s is None else round(claim_s, 2)
            rows.append(
                {"kill": k + 1, "killed": victim, "promoted": new_leader,
                 "kill_to_first_claim_s": seconds}
            )  # fmt: skip
            print(f"kill {k + 1}: {rows[-1]}", flush=True)
            time.sleep(3)
        producer.stop.set()
        producer.join()
        end = time.monotonic() + 120
        while time.monotonic() < end:
            with psycopg.connect(url, autocommit=True) as conn:
                (unfinished,) = conn.execute(
                    "SELECT count(*) FROM leaseq.jobs WHERE status IN ('pending', 'running')"
                ).fetchone()
            if unfinished == 0:
                break
            time.sleep(1)
        reaper.stop.set()
        with psycopg.connect(url, autocommit=True) as conn:
            present = {
                key: (status, attempts)
                for key, status, attempts in conn.execute(
                    "SELECT idempotency_key, status::text, attempt_count FROM leaseq.jobs"
                ).fetchall()
            }
            # Effects are written through the job's key: a second one for a key would be a
            # completion applied twice across a failover.
            effects, distinct_effects = conn.execute(
                "SELECT count(*), count(DISTINCT idempotency_key) FROM leaseq.job_results"
            ).fetchone()
        executions = [tuple(line.split()) for line in log.read_text().splitlines() if line]
        per_job = collections.Counter(job for job, _ in executions)
        per_token = collections.Counter(executions)
        acknowledged = producer.acknowledged
        summary = {
            "kills": kills,
            "workers": workers,
            "acknowledged_enqueues": len(acknowledged),
            "lost_jobs": sum(1 for key in acknowledged if key not in present),
            "unfinished_jobs": sum(1 for s, _ in present.values() if s in ("pending", "running")),
            "succeeded": sum(1 for s, _ in present.values() if s == "succeeded"),
            "dead": sum(1 for s, _ in present.values() if s == "dead"),
            "executions": len(executions),
            "jobs_run_more_than_once": sum(1 for c in per_job.values() if c > 1),
            "token_executed_twice": sum(1 for c in per_token.values() if c > 1),
            "effects_written": effects,
            "duplicate_effects": effects - distinct_effects,
            "attempts_spent": sum(a for _, a in present.values()),
        }
        print(f"summary: {summary}", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder / "failover_chaos.csv", rows)
        _write(folder / "failover_chaos_summary.csv", [summary])
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        cluster.close()


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.failover_chaos", description=__doc__)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    run(args.kills, args.workers, args.results)


if __name__ == "__main__":
    main()
