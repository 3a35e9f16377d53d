"""The kind e2e's numbers test what its phases say (it cannot run here: no Docker engine)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import yaml
from e2e import test_e2e_kind as e2e

import leaseq
from support.cluster import gone

KIND_VALUES = Path(__file__).parents[2] / "charts" / "leaseq" / "ci" / "kind-values.yaml"


def test_jobs_outlast_the_drain_window_so_the_upgrade_releases_some() -> None:
    """A draining pod releases only jobs still running after drainSeconds: with jobs shorter
    than the window, the rolling upgrade would never exercise the release path."""
    worker = yaml.safe_load(KIND_VALUES.read_text())["worker"]
    assert worker["drainSeconds"] < e2e.JOB_SECONDS / 2


def test_the_workload_outlasts_the_phases_before_the_upgrade() -> None:
    """Scale-up, a lease expiry and a reaper pass happen before the upgrade; the queue must
    still hold work then (at full scale the jobs take JOBS * JOB_SECONDS / slots seconds)."""
    values = yaml.safe_load(KIND_VALUES.read_text())
    slots = e2e.MAX_REPLICAS * values["worker"]["concurrency"]
    before_upgrade = values["worker"]["leaseSeconds"] + values["operator"]["reapIntervalSeconds"]
    assert e2e.JOBS * e2e.JOB_SECONDS / slots > 4 * before_upgrade


def _attempt(worker: str, outcome: str) -> leaseq.AttemptRecord:
    now = datetime.now(UTC)
    return leaseq.AttemptRecord(1, 1, 1, worker, now, now, leaseq.AttemptOutcome(outcome), None)


def test_the_upgrade_check_polls_until_a_draining_pod_released() -> None:
    """The upgrade's assertion is a wait: `released_by` is falsy until the database holds a
    release by a worker of an old pod (`helm upgrade --wait` returns while old pods still
    drain), and `gone` waits for the old pods themselves (issue 17; which pods those are is
    tested against the emulator in tests/k8s/test_e2e_pods_k8s.py)."""
    old = {"leaseq-worker-abc-1", "leaseq-worker-abc-2"}
    finished = [_attempt("leaseq-worker-abc-1-0", "succeeded")]
    assert not e2e.released_by(finished, old)
    by_new_pod = [*finished, _attempt("leaseq-worker-def-1-0", "released")]
    assert not e2e.released_by(by_new_pod, old)
    drained = [*by_new_pod, _attempt("leaseq-worker-abc-2-1", "released")]
    assert [a.worker for a in e2e.released_by(drained, old)] == ["leaseq-worker-abc-2-1"]
    assert not gone(old, {"leaseq-worker-abc-2", "leaseq-worker-def-1"})
    assert gone(old, {"leaseq-worker-def-1", "leaseq-worker-def-2"})


def test_the_console_users_secret_is_the_one_the_kind_values_mount() -> None:
    """The e2e creates the console's users Secret before installing: the same name the kind
    values give console.basicAuth (a pod waiting for a missing Secret would hang helm --wait)."""
    console = yaml.safe_load(KIND_VALUES.read_text())["console"]
    assert console["enabled"] is True and console["auth"] == "basic"
    assert console["basicAuth"]["existingSecret"] == e2e.CONSOLE_USERS
