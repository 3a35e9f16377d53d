"""No password is ever printed (issue 11): every entry point, run as a real process with a
password-bearing bad URL, and every output searched for the password: stdout, stderr, the
logs, /metrics and /readyz."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import leaseq
from support import net
from support.polling import wait_for
from support.roles import login_roles

HERE = Path(__file__).parent
PASSWORD = "Pw-S3cret-qzxj"
# No fragment of digits alone: one turned up by chance in a metric's timestamp (1.79641875...).
FRAGMENTS = (PASSWORD, "S3cret", "qzxj")

BAD_URLS = {
    "space in password": f"postgresql://app:{PASSWORD} x@127.0.0.1:1/leaseq",
    "missing scheme": f"app:{PASSWORD}@127.0.0.1:1/leaseq",
    "wrong scheme": f"mysql://app:{PASSWORD}@127.0.0.1:1/leaseq",
    "unreachable": f"postgresql://app:{PASSWORD}@127.0.0.1:1/leaseq",
    "conninfo with a space": f"host=127.0.0.1 port=1 user=app password={PASSWORD} x",
}

COMMANDS = {
    "migrate": ["migrate"],
    "status": ["status"],
    "jobs list": ["jobs", "list"],
    "jobs show": ["jobs", "show", "1"],
    "retry": ["retry", "1"],
    "cancel": ["cancel", "1"],
    "prune": ["prune", "--older-than", "1d"],
    "enqueue": ["enqueue", "q", "t", "--payload", "{}"],
    "worker": ["worker", "--app", "apps:registry", "--queue", "q", "--metrics-port", "0"],
    "demo": ["demo"],
    "operator": ["operator"],
}


def leaks(text: str) -> list[str]:
    return [f for f in FRAGMENTS if f in text]


def run_cli(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run ``leaseq ARGS``; stop it with SIGTERM then SIGKILL if it is still running after
    ``timeout`` (the operator keeps retrying the cluster it cannot reach)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "leaseq.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=HERE,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    return proc.returncode, out.decode(errors="replace")


CASES = [
    # The demo never reads LEASEQ_DATABASE_URL (it runs on its own embedded PostgreSQL unless
    # given --database-url; test_demo checks that), so only its flag is a way in.
    *[(c, u, "env") for c in COMMANDS if c != "demo" for u in BAD_URLS],
    *[("demo", u, "flag") for u in BAD_URLS if u != "missing scheme"],
    *[(c, "missing scheme", "flag") for c in COMMANDS],
]


@pytest.mark.parametrize(("name", "bad", "how"), CASES)
def test_no_entry_point_prints_the_password(name: str, bad: str, how: str, tmp_path: Path) -> None:
    command, url = COMMANDS[name], BAD_URLS[bad]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        "KUBECONFIG": str(tmp_path / "no-kubeconfig"),
        "LEASEQ_METRICS_PORT": "0",
        "LEASEQ_HEALTH_PORT": "0",
    }
    env.pop("LEASEQ_DATABASE_URL", None)
    if how == "env":
        env["LEASEQ_DATABASE_URL"] = url
        argv = command
    else:
        argv = [*command, "--database-url", url]
    long_running = command[0] in ("worker", "operator")
    # A worker waits for an unreachable database (and exits 0 on SIGTERM): give it a while
    # to log its retries, then stop it. Everything else fails at once.
    code, out = run_cli(argv, env, timeout=8 if long_running else 60)
    assert not leaks(out), out
    assert out.strip(), "a failing command must say why"
    if not (long_running and bad == "unreachable"):
        assert code != 0, out


def test_a_malformed_url_is_described_not_quoted(tmp_path: Path) -> None:
    env = {**os.environ, "LEASEQ_DATABASE_URL": BAD_URLS["wrong scheme"]}
    code, out = run_cli(["status"], env)
    assert code == 2
    assert "scheme is 'mysql'" in out and "LEASEQ_DATABASE_URL" in out
    env["LEASEQ_DATABASE_URL"] = BAD_URLS["space in password"]
    code, out = run_cli(["migrate"], env)
    assert code == 2 and "contains a space" in out


def test_pool_warnings_are_masked() -> None:
    """leaseq refuses a malformed URL before a pool sees it; a pool that gets one anyway
    (psycopg_pool logs its connection failures itself, quoting libpq) is masked by the log
    handlers' filter like every other line."""
    from psycopg_pool import ConnectionPool

    from leaseq.runtime import logs

    url = BAD_URLS["missing scheme"]
    with pytest.raises(leaseq.ConfigError) as refused:
        leaseq.open_pool(url)
    assert not leaks(str(refused.value))
    stream = io.StringIO()
    logs.configure("INFO", "text", stream=stream)
    pool: ConnectionPool[psycopg.Connection[tuple[object, ...]]] = ConnectionPool(
        url, min_size=1, timeout=1, open=True
    )
    try:
        wait_for(lambda: "error connecting" in stream.getvalue(), "the pool to warn")
    finally:
        pool.close()
    assert "missing" in stream.getvalue()
    assert not leaks(stream.getvalue()), stream.getvalue()


def test_readyz_metrics_and_logs_of_a_worker_that_loses_its_database(
    database_url: str, tmp_path: Path
) -> None:
    """A worker (as the worker role, with a password in its URL) loses its privileges, then
    its database: /readyz says which, in leaseq's words, never with the server's text."""
    dbname = conninfo_to_dict(database_url)["dbname"]
    port = net.free_port()
    log = tmp_path / "worker.log"
    with login_roles(database_url) as roles:
        names = roles.names
        grants = leaseq.ComponentRoles(names["worker"], names["operator"], names["producer"])
        with leaseq.connect(database_url, action="migrate") as owner:
            leaseq.migrate(owner, grants)
        env = {
            **os.environ,
            "LEASEQ_DATABASE_URL": make_conninfo(roles.urls["worker"], password=PASSWORD),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        }
        cmd = [sys.executable, "-m", "leaseq.cli", "worker", "--app", "apps:registry",
               "--queue", "q", "--metrics-port", str(port), "--poll-seconds", "0.2",
               "--log-level", "DEBUG"]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path
            )
        admin = psycopg.connect(database_url.replace(f"dbname={dbname}", "dbname=postgres"))
        admin.autocommit = True
        bodies = []
        try:
            wait_for(lambda: _get(port, "/readyz")[0] == 200, "the worker to be ready")
            with leaseq.connect(database_url, action="migrate") as owner:
                leaseq.migrate(owner, leaseq.ComponentRoles(None, names["operator"]))
            wait_for(lambda: _get(port, "/readyz")[0] == 503, "/readyz to see the privileges go")
            bodies.append(_get(port, "/readyz")[1])
            assert "lacks a privilege" in bodies[-1], bodies[-1]
            assert "permission denied for" not in bodies[-1], "the server's own text"
            with leaseq.connect(database_url, action="migrate") as owner:
                leaseq.migrate(owner, grants)
            wait_for(lambda: _get(port, "/readyz")[0] == 200, "the worker to be ready again")
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [dbname],
            )
            wait_for(lambda: _get(port, "/readyz")[0] == 503, "/readyz to see the database go")
            bodies.append(_get(port, "/readyz")[1])
            assert bodies[-1].startswith("database: unreachable at"), bodies[-1]
            assert "accepting connections" not in bodies[-1], "the server's own text"
            _, metrics = _get(port, "/metrics")
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            admin.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text(errors="replace")
    assert "permission denied" in text  # the log says exactly what failed (redacted)
    for where, output in {"readyz": "".join(bodies), "metrics": metrics, "log": text}.items():
        assert not leaks(output), f"{where}: {output[-3000:]}"


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        return net.get(f"http://127.0.0.1:{port}{path}")
    except OSError:
        return 0, ""
