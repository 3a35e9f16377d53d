"""``--isolation process``: handlers run in child processes; the worker process (the
supervisor) keeps the leases. Real workers, real children, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support.jobs import finished, take_over
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]


def outcomes(queue: leaseq.Queue, job_id: int) -> list[tuple[str, str]]:
    return [(a.worker, a.outcome) for a in queue.attempts(job_id)]


def pid_in(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text(), f"a pid in {path.name}"))


def running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def gone(pid: int) -> bool:
    """True once ``pid`` has exited and been reaped by its parent."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    "isolation",
    [
        "process",
        pytest.param(
            "thread",
            marks=pytest.mark.xfail(
                strict=True,
                reason="evidence: in a thread, the C call holds the GIL, the heartbeat thread "
                "cannot renew, the lease runs out and the result is fenced",
            ),
        ),
    ],
)
def test_a_handler_holding_the_gil_past_its_lease_completes_once(
    queue: leaseq.Queue, spawn_worker: Spawn, reaper: list[leaseq.Reaped], isolation: str
) -> None:
    # The C call keeps the GIL for 3 s; the lease is 1 s, renewed every 0.3 s.
    w = spawn_worker("w-a", isolation=isolation)
    job_id = queue.enqueue(
        "q", "hold_gil", {"seconds": 3}, idempotency_key="gil", max_attempts=1
    ).job_id

    job = finished(queue, job_id)
    assert outcomes(queue, job_id) == [("w-a", "succeeded")]
    assert job.status == "succeeded"
    assert job.result["pid"] != w.proc.pid  # it ran in a child
    assert reaper == []
    effect = queue.effect("gil")
    assert effect is not None
    assert effect.job_id == job_id
    assert w.metric("leaseq_lease_renewals_total", queue="q") >= 3


def test_each_child_runs_on_startup_once_and_the_supervisor_never_does(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path
) -> None:
    w = spawn_worker("w-a", isolation="process", concurrency=2)
    ids = [
        e.job_id for e in queue.enqueue_many([leaseq.JobSpec("q", "hold_gil", {"seconds": 0})] * 6)
    ]
    pids = {finished(queue, j).result["pid"] for j in ids}

    started = {int(p.name.removeprefix("started-")) for p in tmp_path.glob("started-*")}
    assert w.proc.pid not in started  # the model is loaded in the children only
    assert len(started) == 2  # one per slot, once
    assert pids <= started


@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("wait", "child process killed by SIGKILL (signal 9)"),
        ("exit", "child process exited with code 3"),
        ("segfault", "child process killed by SIGSEGV (signal 11)"),
    ],
)
def test_a_child_that_dies_fails_only_its_attempt_and_the_worker_goes_on(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path, how: str, cause: str
) -> None:
    w = spawn_worker("w-a", isolation="process", lease=5)
    pid_file = tmp_path / "child.pid"
    job_id = queue.enqueue(
        "q", "die", {"how": how, "pid_file": str(pid_file)}, max_attempts=2
    ).job_id
    child = pid_in(pid_file)
    assert child != w.proc.pid
    if how == "wait":
        os.kill(child, signal.SIGKILL)  # what the OOM killer does

    job = finished(queue, job_id)
    assert job.status == "succeeded"
    assert job.result["attempt"] == 2
    assert job.result["pid"] != child  # a new child took the retry
    attempts = queue.attempts(job_id)
    assert [(a.worker, a.outcome) for a in attempts] == [("w-a", "failed"), ("w-a", "succeeded")]
    assert attempts[0].error is not None
    assert cause in attempts[0].error
    assert w.proc.poll() is None
    assert w.metric("leaseq_child_processes_started_total") == 2  # the first, its replacement
    labels = {"queue": "q", "job_type": "die"}
    assert w.metric("leaseq_jobs_finished_total", **labels, outcome="failed") == 1
    # The worker goes on: the next job runs too.
    nxt = queue.enqueue("q", "work", {"seconds": 0}).job_id
    assert finished(queue, nxt).status == "succeeded"


def test_a_runaway_handler_is_killed_at_its_max_runtime(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path
) -> None:
    w = spawn_worker("w-a", isolation="process", lease=5)
    pid_file = tmp_path / "child.pid"
    job_id = queue.enqueue(
        "q", "runaway", {"pid_file": str(pid_file)}, timeout=1.5, max_attempts=1
    ).job_id
    child = pid_in(pid_file)

    job = finished(queue, job_id)
    assert (job.status, job.last_error_code) == ("dead", "TIMED_OUT")
    assert outcomes(queue, job_id) == [("w-a", "timed_out")]
    wait_for(lambda: gone(child), "the runaway child to be killed")
    # Its slot has a new child: the next job runs.
    nxt = queue.enqueue("q", "work", {"seconds": 0}).job_id
    assert finished(queue, nxt).status == "succeeded"
    assert w.metric("leaseq_jobs_in_flight", queue="q") == 0


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_progress_checkpoints_and_should_stop_work_the_same_in_both_modes(
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    spawn_worker: Spawn,
    tmp_path: Path,
    isolation: str,
) -> None:
    spawn_worker("w-a", isolation=isolation, lease=2, heartbeat=0.2)
    gate = tmp_path / "gate"
    # Progress and a checkpoint (from the child: stored by the supervisor); a retry sees it.
    job_id = queue.enqueue("q", "steps", {"gate": str(gate)}).job_id
    wait_for(lambda: queue.get(job_id).progress == {"pct": 50}, "progress stored by a renewal")
    assert queue.get(job_id).checkpoint == {"step": 3}
    gate.touch()
    job = finished(queue, job_id)
    assert job.result["resumed"] == {"step": 3}
    assert [a.outcome for a in queue.attempts(job_id)] == ["failed", "succeeded"]
    assert "stored=True" in (queue.attempts(job_id)[0].error or "")

    # A checkpoint after the lease was taken over is refused, and the handler is told to stop.
    gate, report = tmp_path / "gate2", tmp_path / "report.json"
    job_id = queue.enqueue(
        "q", "late_checkpoint", {"gate": str(gate), "report": str(report)}
    ).job_id
    wait_for(lambda: queue.get(job_id).status == "running", "the job to start")
    take_over(queue, conn, job_id)
    gate.touch()
    seen = json.loads(wait_for(lambda: report.exists() and report.read_text(), "the report"))
    assert seen == {"stored": False, "should_stop": True, "reason": "lease_lost", "wait": True}
    assert queue.get(job_id).checkpoint is None


@pytest.mark.parametrize("lost", ["cancelled", "taken_over"])
def test_a_cancel_or_a_lost_lease_kills_the_child_and_a_new_one_takes_the_next_job(
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    spawn_worker: Spawn,
    tmp_path: Path,
    lost: str,
) -> None:
    w = spawn_worker("w-a", isolation="process", lease=2, heartbeat=0.2)
    # The supervisor hears of it at the next renewal, and kills the child.
    pid_file = tmp_path / "runaway.pid"
    job_id = queue.enqueue("q", "runaway", {"pid_file": str(pid_file)}).job_id
    child = pid_in(pid_file)
    if lost == "cancelled":
        queue.cancel(job_id)
    else:
        take_over(queue, conn, job_id)
    wait_for(lambda: gone(child), f"the child of the {lost} job to be killed")
    assert queue.get(job_id).status == ("cancelled" if lost == "cancelled" else "running")
    # A cancellation is asked for: recorded as cancelled, not counted as a lost lease.
    assert w.metric("leaseq_lease_losses_total", queue="q") == (lost != "cancelled")
    if lost == "cancelled":
        assert outcomes(queue, job_id) == [("w-a", "cancelled")]
    nxt = queue.enqueue("q", "work", {"seconds": 0}).job_id
    assert finished(queue, nxt).status == "succeeded"
    assert queue.get(nxt).result["worker"] == "w-a"


def test_sigterm_in_process_mode_releases_unfinished_jobs_and_exits_0(
    queue: leaseq.Queue, workers: leaseq.Workers, spawn_worker: Spawn, tmp_path: Path
) -> None:
    w = spawn_worker("w-a", isolation="process", concurrency=3, lease=60, heartbeat=1, drain=1)
    gate = tmp_path / "gate"
    pid_file = tmp_path / "runaway.pid"
    cooperative = queue.enqueue("q", "gated", {"gate": str(gate)}).job_id
    runaway = queue.enqueue("q", "runaway", {"pid_file": str(pid_file)}).job_id
    quick = queue.enqueue("q", "work", {"seconds": 0.3}).job_id
    child = pid_in(pid_file)
    wait_for(
        lambda: all(queue.get(j).status != "pending" for j in (cooperative, runaway, quick)),
        "all three jobs claimed",
    )

    w.signal(signal.SIGTERM)
    assert w.wait_exit() == 0

    assert queue.get(quick).status == "succeeded"
    for job_id in (cooperative, runaway):
        job = queue.get(job_id)
        assert (job.status, job.attempt_count) == ("pending", 0)  # no attempt spent
        assert outcomes(queue, job_id) == [("w-a", "released")]
    assert gone(child)
    assert workers.list() == []


def test_a_heartbeat_starved_by_a_handler_holding_the_gil_says_so(
    queue: leaseq.Queue, spawn_worker: Spawn
) -> None:
    # Thread mode: the C call keeps the GIL for 2 s, the heartbeat is due every 0.3 s. A
    # long lease, so the job still succeeds: the warning comes before anything is lost.
    w = spawn_worker("w-a", lease=30, heartbeat=0.3)
    job_id = queue.enqueue("q", "hold_gil", {"seconds": 2}, max_attempts=1).job_id
    assert finished(queue, job_id).status == "succeeded"

    assert w.metric("leaseq_worker_heartbeat_late_total") >= 1
    warnings = [
        line for line in w.log.read_text().splitlines() if "WARNING leaseq.heartbeat" in line
    ]
    assert any(
        "heartbeat ran" in line
        and "holding the GIL or blocking in C" in line
        and "--isolation process" in line
        for line in warnings
    ), warnings


def test_a_child_stops_at_its_lease_end_while_its_supervisor_is_stopped(
    queue: leaseq.Queue, spawn_worker: Spawn, reaper: list[leaseq.Reaped], tmp_path: Path
) -> None:
    # Only the worker process stalls (SIGSTOP): it can neither renew nor kill its child.
    w = spawn_worker("w-a", isolation="process", lease=1, heartbeat=0.3)
    pid_file, effect = tmp_path / "child.pid", tmp_path / "effect"
    payload = {"seconds": 6, "pid_file": str(pid_file), "effect": str(effect)}
    job_id = queue.enqueue("q", "late_effect", payload).job_id
    child = pid_in(pid_file)
    w.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: any(r.job_id == job_id for r in reaper), "the expired lease reaped")
        # The child stopped by itself at the end of its lease (its guard killed it): a zombie
        # until its stopped parent reaps it, and no effect of the expired attempt.
        wait_for(lambda: not running(child), "the stale child to stop at its lease's end")
        assert not effect.exists()
    finally:
        w.signal(signal.SIGCONT)
    job = finished(queue, job_id)
    assert job.status == "succeeded"
    assert effect.read_text() == "2\n"  # only the next attempt's effect
    _first, second = outcomes(queue, job_id)  # the first: reaped, then fenced on resume
    assert second == ("w-a", "succeeded")
    wait_for(lambda: gone(child), "the killed child reaped once its worker runs again")


def test_a_job_its_child_has_no_handler_for_fails_as_no_handler_and_the_slot_goes_on(
    spawn_worker: Spawn, queue: leaseq.Queue
) -> None:
    """The worker claims a type its children do not register: the attempt fails with
    ``NoHandler`` (retried like any error, here dead at its one attempt), the child is not
    lost, and the next job runs on the same slot."""
    spawn_worker("w-a", isolation="process", app="parent_only_app:registry")
    orphan = queue.enqueue("q", "parent_only", {}, max_attempts=1).job_id
    after = queue.enqueue("q", "work", {"n": 1}).job_id
    job = finished(queue, orphan)
    assert (job.status, job.last_error_code) == ("dead", "NoHandler")
    assert "no handler is registered for job type 'parent_only'" in (job.last_error or "")
    assert finished(queue, after).status == "succeeded"
    assert outcomes(queue, orphan) == [("w-a", "failed")]


def killed_while_a_child_starts(
    database_url: str, tmp_path: Path, main: list[str], pythonpath: list[Path]
) -> None:
    """Run ``python <main> worker`` (process isolation, ``pythonpath`` first) whose children
    record their pid as ``starting-<pid>`` and are then held in their start-up; SIGKILL it
    once one is, and wait (bounded) for that child to die."""
    log = tmp_path / "w-a.log"
    cmd = [sys.executable, *main, "worker", "--app", "apps:registry",
           "--queue", "q", "--metrics-port", "0", "--isolation", "process"]  # fmt: skip
    paths = [*map(str, pythonpath), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, paths)),
        "LEASEQ_DATABASE_URL": database_url,
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        started = wait_for(lambda: list(tmp_path.glob("starting-*")), "a child to start")
        child = int(started[0].name.removeprefix("starting-"))
        assert running(child)
        proc.kill()
        proc.wait(timeout=30)
        wait_for(lambda: not running(child), "the starting child to die with its worker", 10)
    finally:
        if proc.poll() is None:
            proc.kill()
        for path in tmp_path.glob("starting-*"):
            pid = int(path.name.removeprefix("starting-"))
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_child_still_starting_dies_with_its_sigkilled_worker(
    database_url: str, tmp_path: Path
) -> None:
    """A child held inside its interpreter's start-up (multiprocessing importing the
    worker's main module, before any of the child's own code) dies with its SIGKILLed
    worker: it asked for that at its first ``import leaseq``."""
    here = Path(__file__).parent
    killed_while_a_child_starts(database_url, tmp_path, [str(here / "held_main.py")], [here])


def test_a_child_held_before_its_interpreter_imports_anything_dies_with_its_sigkilled_worker(
    database_url: str, tmp_path: Path
) -> None:
    """Earlier still: a child held in ``site`` (its ``sitecustomize``), before it imported
    leaseq or the worker's main module, dies with its SIGKILLed worker. Its parent-death
    signal was set before its interpreter started (setpriv, leaseq.runtime.launch)."""
    here = Path(__file__).parent
    main = ["-m", "leaseq.cli"]
    killed_while_a_child_starts(database_url, tmp_path, main, [here / "held_site", here])


def children(pid: int) -> list[int]:
    """The children of ``pid`` (host pids), from every one of its threads."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_a_process_worker_as_pid_1_runs_reaps_orphans_and_exits_0_on_sigterm(
    queue: leaseq.Queue, database_url: str, tmp_path: Path
) -> None:
    """The worker as PID 1 of its own PID namespace, as a kubelet runs the entrypoint: its
    children start (a parent pid of 1 is not taken for a dead parent), the guard a killed
    child leaves behind is reaped by the worker, and SIGTERM stops it with status 0."""
    namespace = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    probe = subprocess.run([*namespace, "true"], capture_output=True, check=False)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip(f"no PID namespace here: {probe.stderr.decode(errors='replace').strip()}")
    here = Path(__file__).parent
    pythonpath = os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, "LEASEQ_DATABASE_URL": database_url}
    cmd = [*namespace, sys.executable, "-m", "leaseq.cli", "worker", "--app", "apps:registry",
           "--queue", "q", "--metrics-port", "0", "--isolation", "process",
           "--lease-seconds", "5", "--heartbeat-seconds", "1"]  # fmt: skip
    log = tmp_path / "pid1.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        [worker] = wait_for(lambda: children(proc.pid), "the worker in its namespace")
        assert finished(queue, queue.enqueue("q", "work", {}).job_id).status == "succeeded"
        slot = wait_for(lambda: next((p for p in children(worker) if children(p)), None), "a child")
        [guard] = children(slot)
        os.kill(slot, signal.SIGKILL)
        wait_for(
            lambda: not Path(f"/proc/{guard}").exists() and not Path(f"/proc/{slot}").exists(),
            "the killed child and its orphaned guard reaped by PID 1",
        )
        assert finished(queue, queue.enqueue("q", "work", {}).job_id).status == "succeeded"
        os.kill(worker, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_childs_last_write_lands_before_its_lease_ends_in_database_time(
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    spawn_worker: Spawn,
    database_url: str,
    tmp_path: Path,
) -> None:
    """The guard's margin, measured: the supervisor is stopped (no renewal, no kill) and no
    reaper runs, so the lease's end stays where the last renewal put it; the child writes to
    the database until its guard kills it, and its last committed write must be earlier than
    that end, by the database's clock (another worker may claim the job from then on)."""
    conn.execute("CREATE TABLE probe (at timestamptz NOT NULL)")
    w = spawn_worker("w-a", isolation="process", lease=1, heartbeat=0.3, app="probe_app:registry")
    pid_file = tmp_path / "child.pid"
    job_id = queue.enqueue("q", "probe", {"url": database_url, "pid_file": str(pid_file)}).job_id
    child = pid_in(pid_file)
    w.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: not running(child), "the child killed by its guard")
        row = conn.execute(
            "SELECT (SELECT max(at) FROM probe), j.lease_expires_at, j.status::text"
            " FROM leaseq.jobs j WHERE j.id = %s",
            (job_id,),
        ).fetchone()
    finally:
        w.signal(signal.SIGCONT)
    assert row is not None
    last_write, lease_end, status = row
    assert status == "running"  # not reaped: the lease's end is the one the child ran under
    assert last_write < lease_end, f"a write landed {last_write - lease_end} after the lease"
