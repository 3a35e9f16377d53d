"""A primary and a streaming standby of Debian's PostgreSQL 15 (a standby needs its primary's
major version; the embedded wheel is 18 and has no ``pg_basebackup``), for the failover tests:
replication held back, the primary killed, the standby promoted, as an HA manager would."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from support import net
from support.polling import wait_for

BIN = Path(os.environ.get("LEASEQ_TEST_PG15_BIN", "/usr/lib/postgresql/15/bin"))
TOOLS = ("initdb", "pg_ctl", "pg_basebackup")
# PostgreSQL refuses to run as root; its Debian user runs it instead.
RUN_AS = "postgres"


def missing() -> str | None:
    """Why the pair cannot be built here (None when it can)."""
    absent = [tool for tool in TOOLS if not (BIN / tool).exists()]
    if absent:
        return f"PostgreSQL 15's {', '.join(absent)} not found in {BIN} (Debian's postgresql-15)"
    return None


def _run(*cmd: str | Path) -> None:
    argv = [str(c) for c in cmd]
    if os.geteuid() == 0:
        argv = ["setpriv", f"--reuid={RUN_AS}", f"--regid={RUN_AS}", "--clear-groups", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")


class Node:
    """One server of the pair: its data directory, port and log."""

    def __init__(self, root: Path, name: str) -> None:
        self.data = root / name
        self.port = net.free_port()
        self.log = root / f"{name}.log"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        _run(BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode``; ``immediate`` is a crash: whatever was not sent is lost."""
        _run(BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            cur = conn.execute(statement.encode())
            return cur.fetchall() if cur.description else []


class StreamingPair:
    """A primary and a standby made from it with ``pg_basebackup -R``, streaming. ``url``
    names both (``target_session_attrs=read-write``): a client that reconnects after a
    promotion lands on whichever one accepts writes, as a worker with a multi-host URL does."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="leaseq-ha-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, RUN_AS, RUN_AS)
        self.primary = Node(self.root, "primary")
        self.standby = Node(self.root, "standby")
        _run(BIN / "initdb", "-D", self.primary.data, "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--no-instructions")  # fmt: skip
        with (self.primary.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "listen_addresses = '127.0.0.1'\n"
                f"port = {self.primary.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                "wal_level = replica\nmax_wal_senders = 4\nwal_keep_size = '256MB'\n"
                "hot_standby = on\nmax_connections = 60\nshared_buffers = '32MB'\n"
            )
        self.primary.start()
        _run(BIN / "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port),
             "-U", "postgres", "-D", self.standby.data, "-R", "-X", "stream",
             "--checkpoint=fast")  # fmt: skip
        with (self.standby.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {self.standby.port}\n")
        self.standby.start()
        wait_for(self.streaming, "the standby to stream from the primary", timeout=60)

    def url(self, dbname: str) -> str:
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{dbname}?target_session_attrs=read-write&connect_timeout=2"
        )

    def streaming(self) -> bool:
        return bool(
            self.standby.sql("SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming'")
        )

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        (lsn,) = self.primary.sql("SELECT pg_current_wal_lsn()::text")[0]
        wait_for(
            lambda: self.standby.sql(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0],
            f"the standby to replay up to {lsn}",
        )

    def hold_back(self) -> None:
        """Cut the standby off its primary (its WAL receiver stopped, not paused: a paused
        replay would still be replayed at promotion): what commits on the primary from now
        on is lost when the primary dies, as in an asynchronous failover."""
        self.standby.sql("ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.sql("SELECT pg_reload_conf()")
        wait_for(
            lambda: not self.standby.sql("SELECT 1 FROM pg_stat_wal_receiver"),
            "the standby's WAL receiver to stop",
        )

    def fail_over(self) -> None:
        """Kill the primary (``pg_ctl stop -m immediate``) and promote the standby."""
        self.primary.stop("immediate")
        _run(BIN / "pg_ctl", "-D", self.standby.data, "-w", "-t", "60", "promote")

    def close(self) -> None:
        for node in (self.primary, self.standby):
            if node.running():
                with contextlib.suppress(RuntimeError):
                    node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
