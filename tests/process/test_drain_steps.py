"""A drain never hands a job back while one of its steps runs: a worker SIGTERMed while a
step's function is still on its way to its effect, past the drain window, keeps the job
(renewing its lease) until the step is recorded, and only then releases it to the worker
waiting for it. Both isolation modes, a reconciled step and a plain one: exactly one effect,
written by the first function, which nobody reconciled. Real workers, real SIGTERM; the
moments are made exact with files, never sleeps."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

APP = "steps_app:registry"
HELD = "inside a step keep their lease until the step ends"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("mode", ["reconcile", "none"])
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_drain_releases_a_job_only_once_its_running_step_is_recorded(
    queue: leaseq.Queue,
    spawn_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
    mode: str,
    isolation: str,
) -> None:
    folder = tmp_path / "step"
    folder.mkdir()
    payload = {"dir": str(folder), "mode": mode, "hold": "w-a"}
    a = spawn_worker("w-a", app=APP, isolation=isolation, drain=1.0)
    job_id = queue.enqueue("q", "drained_step", payload).job_id
    wait_for(lambda: lines(folder / "pay.calls") == ["w-a"], "the payment to start", timeout=60)
    # Waiting, idle, to claim the job the moment it is released.
    spawn_worker("w-b", app=APP, isolation=isolation)
    a.signal(signal.SIGTERM)

    def first_worker_done_with_it() -> bool:
        """w-a says it holds the job past its window, or it has let it go: w-b paid, or
        stopped the job at the uncertain step (the drain released it mid-step)."""
        job = queue.get(job_id)
        stopped = job.status in ("held", "dead")
        return HELD in a.log.read_text() or bool(lines(folder / "effects")) or stopped

    wait_for(first_worker_done_with_it, "the drain window to end", timeout=60)
    (folder / "gate").touch()
    job = wait_for(
        lambda: (j := queue.get(job_id)).status in ("succeeded", "held", "dead") and j,
        "the job",
        60,
    )
    assert a.wait_exit() == 0
    # Its next step was refused on purpose, not for a lost lease: nothing to warn about.
    assert "lease lost" not in a.log.read_text()
    assert lines(folder / "effects") == ["w-a"]
    assert lines(folder / "check.calls") == []
    assert (job.status, job.result) == ("succeeded", {"paid": {"paid_by": "w-a"}, "after": "w-b"})
    assert {s.name for s in queue.steps(job_id) if s.recorded} == {"pay", "after"}
