"""Peers that live in virtual environments of their own: DBOS Transact, Chancy, Oban for Python.

Each is installed, pinned, into ``<cache>/<name>-<version>`` (``$LEASEQ_BENCH_PEERS_DIR``, by
default ``~/.cache/leaseq-bench/peers``) with an interpreter it accepts (Oban for Python needs
3.12 or later), never into the project's environment, whose dependencies stay as they are.
A peer that cannot be installed is reported with the reason (:class:`PeerUnavailable`).

The harness is :func:`bench.gang.run_gang`'s, as for the other peers: one gang process per
worker starts the peer's worker (:mod:`bench.peer_child`, run by the peer's interpreter),
waits until it is ready, and passes the gang's start signal on. Every handler stamps its
start and end (wall clock) into a file; a run lasts from the start signal to the last
completion stamped, and the limit scenario's overlap is counted from those stamps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.context import Context
from bench.env import scratch_database
from bench.gang import GangRun, Signals, run_gang, server_cpu_meter
from bench.stats import loadavg

CHILD = Path(__file__).with_name("peer_child.py")


class PeerUnavailable(Exception):
    """The peer cannot be installed or started on this machine; the message says why."""


@dataclass(frozen=True)
class Spec:
    """A peer: its PyPI package (pinned), the oldest interpreter it accepts, how the
    database tells that work is left, how many jobs succeeded, and its limit's scope."""

    name: str
    package: str
    version: str
    min_python: tuple[int, int]
    unfinished_sql: str
    finished_sql: str
    limit_scope: str
    guarantees: str


SPECS = (
    Spec(
        "dbos",
        "dbos",
        "3.4.0",
        (3, 10),
        "SELECT EXISTS (SELECT 1 FROM dbos.workflow_status"
        " WHERE status IN ('ENQUEUED', 'PENDING'))",
        "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'",
        "global",
        "durable workflows: each job is a workflow whose status row is written when it is "
        "dequeued and when it ends; a process's unfinished workflows are recovered by "
        "executor id when it restarts",
    ),
    Spec(
        "chancy",
        "chancy",
        "0.26.0",
        (3, 11),
        "SELECT EXISTS (SELECT 1 FROM chancy_jobs"
        " WHERE state IN ('pending', 'running', 'retrying'))",
        "SELECT count(*) FROM chancy_jobs WHERE state = 'succeeded'",
        "per process",
        "a claim id per execution; running jobs of a worker whose heartbeat stops are "
        "recovered by the Recovery plugin; completions are sent in batches",
    ),
    Spec(
        "oban",
        "oban",
        "0.7.0",
        (3, 12),
        "SELECT EXISTS (SELECT 1 FROM oban_jobs"
        " WHERE state IN ('available', 'scheduled', 'executing', 'retryable'))",
        "SELECT count(*) FROM oban_jobs WHERE state = 'completed'",
        "per process",
        "jobs of a node that stops are rescued by the leader's lifeline; completions are "
        "acknowledged in batches on the next fetch",
    ),
)


def cache_dir() -> Path:
    configured = os.environ.get("LEASEQ_BENCH_PEERS_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "leaseq-bench" / "peers"


def candidate_interpreters() -> list[Path]:
    """Interpreters to try, in order: ``$LEASEQ_BENCH_PEER_PYTHONS`` (colon-separated),
    the one running the bench, ``python3.N`` on PATH, pyenv's versions."""
    found = [Path(p) for p in os.environ.get("LEASEQ_BENCH_PEER_PYTHONS", "").split(":") if p]
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    found.append(base)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found += sorted(Path(folder).glob("python3.1[0-9]"), reverse=True)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found += sorted(pyenv.glob("3.1[0-9]*/bin/python3"), reverse=True)
    return found


def interpreter_version(python: Path) -> tuple[int, int] | None:
    """The interpreter's (major, minor), or None when it does not run."""
    try:
        out = subprocess.run(
            [str(python), "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def pick_interpreter(spec: Spec, candidates: Iterable[Path]) -> Path:
    """The first candidate at least ``spec.min_python``; PeerUnavailable naming what was
    tried when none is."""
    tried = []
    for python in candidates:
        found = interpreter_version(python)
        tried.append(f"{python} ({_dotted(found) if found else 'does not run'})")
        if found and found >= spec.min_python:
            return python
    raise PeerUnavailable(
        f"{spec.package} {spec.version} needs Python >= {_dotted(spec.min_python)}; "
        "none found among: " + (", ".join(tried) or "no candidates")
    )


def _dotted(version: tuple[int, int]) -> str:
    return ".".join(str(part) for part in version)


def ensure_venv(spec: Spec, root: Path | None = None) -> Path:
    """The Python of ``spec``'s own virtual environment, created and installed if needed."""
    home = (root or cache_dir()) / f"{spec.name}-{spec.version}"
    python = home / "bin" / "python"
    check = [str(python), "-c", f"import {spec.name}, psycopg"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    base = pick_interpreter(spec, candidate_interpreters())
    home.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [str(base), "-m", "venv", "--clear", str(home)],
        [str(python), "-m", "pip", "install", "--quiet", f"{spec.package}=={spec.version}",
         "psycopg[binary]"],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise PeerUnavailable(f"`{' '.join(step)}` failed: {done.stderr.strip()[-500:]}")
    return python


# -- a run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildArgs:
    """What one gang process needs to start one worker of the peer."""

    python: str
    config: dict[str, Any]
    stamps: str


def child_env(stamps: str, worker: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(CHILD.parent),  # the handlers' module, by its import path
        "LEASEQ_PEER_STAMPS": stamps,
        "LEASEQ_PEER_WORKER": worker,
    }


def call(python: Path, command: str, config: dict[str, Any], timeout: float = 600.0) -> str:
    """Run ``peer_child.py COMMAND`` to completion and return what it printed; RuntimeError
    with its stderr if it fails."""
    with tempfile.TemporaryDirectory() as stamps:
        done = subprocess.run(
            [str(python), str(CHILD), command, json.dumps(config)],
            capture_output=True, text=True, timeout=timeout, env=child_env(stamps, "setup"),
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{config['peer']} {command} failed: {done.stderr.strip()[-800:]}")
    return done.stdout


def relay(args: ChildArgs, signals: Signals) -> dict[str, float]:
    """In a gang process: start the peer's worker, pass the start and stop signals on, and
    return when the start signal came (wall clock) and the worker's CPU seconds since."""
    worker = args.config["worker"]
    with (
        open(Path(args.stamps) / f"stderr-{worker}", "w") as err,
        subprocess.Popen(
            [args.python, str(CHILD), "work", json.dumps(args.config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
            env=child_env(args.stamps, worker), start_new_session=True,
        ) as proc,
    ):  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{worker} did not start: {_tail(args.stamps, worker)}")
            # Stopped, with every process it started, while the jobs are enqueued.
            os.killpg(proc.pid, signal.SIGSTOP)
            signals.ready()
            started = time.time()
            os.killpg(proc.pid, signal.SIGCONT)
            proc.stdin.write("start\n")
            proc.stdin.flush()
            while not signals.stopping():
                if proc.poll() is not None:
                    raise RuntimeError(f"{worker} exited: {_tail(args.stamps, worker)}")
                time.sleep(0.02)
            proc.stdin.write("stop\n")
            proc.stdin.flush()
            report = json.loads(proc.stdout.readline() or "{}")
            return {"started": started, "cpu": float(report.get("cpu", 0.0))}
        finally:
            # The numbers are in; the peer's own shutdown is not measured (DBOS's can take
            # longer than the gang waits for its processes). Killed with every process it
            # started; the next run empties its tables.
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)


def _tail(stamps: str, worker: str) -> str:
    text = (Path(stamps) / f"stderr-{worker}").read_text(errors="replace")
    return text.strip()[-800:] or "(no output)"


@dataclass(frozen=True)
class Stamp:
    worker: str
    started: float
    ended: float


def read_stamps(folder: Path) -> list[Stamp]:
    """Every handler's ``worker start end`` line from the stamp files."""
    stamps = []
    for path in folder.iterdir():
        if path.name.startswith("stderr-"):
            continue
        for line in path.read_text().splitlines():
            worker, started, ended = line.split()
            stamps.append(Stamp(worker, float(started), float(ended)))
    return stamps


def max_overlap(stamps: Sequence[Stamp]) -> int:
    """The most handlers running at one instant. A handler that ends at the instant another
    starts does not overlap it."""
    events = sorted([(s.started, 1) for s in stamps] + [(s.ended, -1) for s in stamps])
    running = peak = 0
    for _, step in events:  # at equal times -1 sorts first: the end before the start
        running += step
        peak = max(peak, running)
    return peak


def max_overlap_per_worker(stamps: Sequence[Stamp]) -> int:
    """The most handlers running at one instant within one worker process."""
    workers = {s.worker for s in stamps}
    return max((max_overlap([s for s in stamps if s.worker == w]) for w in workers), default=0)


@dataclass(frozen=True)
class PeerRun:
    stamps: list[Stamp]
    finished: int
    gang: GangRun[dict[str, float]]

    @property
    def started(self) -> float:
        return min(r["started"] for r in self.gang.results)

    @property
    def seconds(self) -> float:
        """From the start signal to the last completion stamped."""
        return max((s.ended for s in self.stamps), default=self.started) - self.started


class ExternalPeer:
    """One peer in its own environment, installed in one scratch database."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.name = spec.name

    def open(self, url: str, venvs: Path | None = None) -> None:
        self.python = ensure_venv(self.spec, venvs)
        self.url = url
        call(self.python, "install", {"peer": self.name, "url": url})

    def run(
        self,
        *,
        jobs: int,
        workers: int,
        setting: str,
        batch: int,
        task: str = "noop",
        seconds: float = 0.0,
        cap_seconds: float = 60.0,
        poll: float = 0.1,
    ) -> PeerRun:
        """Enqueue ``jobs``, then drain them with ``workers`` worker processes at ``setting``."""
        config = {
            "peer": self.name, "url": self.url, "jobs": jobs, "task": task, "seconds": seconds,
            "setting": setting, "batch": batch, "poll": poll,
        }  # fmt: skip
        call(self.python, "reset", config)
        with (
            tempfile.TemporaryDirectory() as stamps,
            psycopg.connect(self.url, autocommit=True) as conn,
        ):

            def enqueue() -> None:  # every worker is ready and stopped
                call(self.python, "enqueue", config)
                conn.execute("VACUUM ANALYZE")

            deadline: list[float] = []

            def done() -> bool:
                if not deadline:
                    deadline.append(time.perf_counter() + cap_seconds)
                row = conn.execute(self.spec.unfinished_sql).fetchone()
                return not (row and row[0]) or time.perf_counter() > deadline[0]

            gang = run_gang(
                relay,
                [
                    ChildArgs(str(self.python), {**config, "worker": f"w{i + 1}"}, stamps)
                    for i in range(workers)
                ],
                until=done,
                server_cpu=server_cpu_meter(self.url),
                before_start=enqueue,
            )
            row = conn.execute(self.spec.finished_sql).fetchone()
            return PeerRun(read_stamps(Path(stamps)), int(row[0]) if row else 0, gang)


class ExternalArm:
    """A peer in its own environment as an arm of :mod:`bench.peers`: no-op throughput at
    its default and tuned settings, and its concurrency limit."""

    def __init__(self, ctx: Context, spec: Spec, plan: dict[str, Any]) -> None:
        self.ctx, self.spec, self.plan = ctx, spec, plan
        self.name = spec.name
        self.peer = ExternalPeer(spec)
        self.base = {
            "implementation": spec.name,
            "loop": "runtime",
            "version": spec.version,
            "guarantees": spec.guarantees,
        }

    def open(self, stack: contextlib.ExitStack) -> None:
        url = stack.enter_context(
            scratch_database(self.ctx.server_url, f"peer_{self.name}", migrate=False)
        )
        self.peer.open(url)

    def noop(self, workers: int) -> list[dict[str, Any]]:
        rows = []
        for setting, batch in self.plan["external"]["settings"][self.name]:
            load = loadavg()
            run = self.peer.run(
                jobs=self.plan["jobs"], workers=workers, setting=setting, batch=batch,
                cap_seconds=self.plan["cap"],
            )  # fmt: skip
            row = noop_row(run, jobs=self.plan["jobs"], workers=workers, batch=batch)
            self.ctx.log(
                f"peers noop {self.name} W={workers} {setting} {batch}: "
                f"{row['jobs_per_second']} jobs/s"
            )
            rows.append({"kind": "noop", **self.base, "setting": setting, **row, "loadavg": load})
        return rows

    def sleep(self) -> list[dict[str, Any]]:
        return []  # scenario 1's loop needs a claim call of the peer's API: not measured here

    def limits(self) -> list[dict[str, Any]]:
        limits = self.plan["external"]["limits"]
        load = loadavg()
        run = self.peer.run(
            jobs=limits["jobs"], workers=limits["workers"], setting="limit",
            batch=limits["limit"], task="hold", seconds=limits["job_seconds"],
            cap_seconds=self.plan["cap"],
        )  # fmt: skip
        row = limits_row(
            run, self.spec, jobs=limits["jobs"], workers=limits["workers"], limit=limits["limit"],
            job_seconds=limits["job_seconds"],
        )  # fmt: skip
        self.ctx.log(
            f"peers limits {self.name} limit {limits['limit']} ({self.spec.limit_scope}): "
            f"overlap {row['max_overlap']}, per process {row['max_overlap_per_process']}"
        )
        return [{"kind": "limits", **self.base, **row, "loadavg": load}]


def noop_row(run: PeerRun, *, jobs: int, workers: int, batch: int) -> dict[str, Any]:
    """The peers' no-op columns, timed from the start signal to the last completion."""
    per = 1000.0 / max(run.finished, 1)
    client = sum(r["cpu"] for r in run.gang.results)
    server = run.gang.server_cpu
    return {
        "workers": workers,
        "batch": batch,
        "jobs": jobs,
        "finished": run.finished,
        "executions": len(run.stamps),
        "seconds": round(run.seconds, 4),
        "jobs_per_second": round(run.finished / run.seconds, 1) if run.seconds > 0 else 0.0,
        "client_cpu_ms_per_job": round(client * per, 3),
        "server_cpu_ms_per_job": "" if server is None else round(server * per, 3),
        "machine_cpu_ms_per_job": round(run.gang.machine_cpu * per, 3),
    }


def limits_row(
    run: PeerRun, spec: Spec, *, jobs: int, workers: int, limit: int, job_seconds: float
) -> dict[str, Any]:
    """A limit of ``limit`` held when no instant had more handlers running than it allows:
    across all processes for a global limit, within each process for a per-process one
    (whose fleet-wide bound is then ``limit`` x ``workers``)."""
    overlap, per_process = max_overlap(run.stamps), max_overlap_per_worker(run.stamps)
    bound = overlap if spec.limit_scope == "global" else per_process
    return {
        "workers": workers,
        "jobs": jobs,
        "job_seconds": job_seconds,
        "limit": limit,
        "limit_scope": spec.limit_scope,
        "finished": run.finished,
        "executions": len(run.stamps),
        "seconds": round(run.seconds, 4),
        "max_overlap": overlap,
        "max_overlap_per_process": per_process,
        "limit_held": bound <= limit,
        "global_limit_held": overlap <= limit,
    }
