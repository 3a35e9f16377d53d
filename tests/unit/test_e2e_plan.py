"""The kind e2e's numbers test what its phases say (it cannot run here: no Docker engine)."""

from __future__ import annotations

from pathlib import Path

import yaml
from e2e import test_e2e_kind as e2e

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
