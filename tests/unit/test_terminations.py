"""Which worker container terminations a pod's status confirms (pure, no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from leaseq_operator.terminations import POD_NAME_ENV, terminated

DOWNWARD = {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


def _pod(statuses: list[dict[str, Any]], containers: list[dict[str, Any]] | None = None) -> Any:
    return {
        "metadata": {"name": "workers-a", "namespace": "jobs", "uid": "u-1"},
        "spec": {
            "nodeName": "node-1",
            "containers": containers
            if containers is not None
            else [{"name": "worker", "env": [DOWNWARD]}, {"name": "proxy"}],
        },
        "status": {"containerStatuses": statuses},
    }


def _ended(finished: str, reason: str = "OOMKilled") -> dict[str, Any]:
    return {"terminated": {"reason": reason, "exitCode": 137, "finishedAt": finished}}


def test_the_worker_containers_current_termination_wins_over_an_earlier_one() -> None:
    ended = terminated(_pod([{
        "name": "worker",
        "state": _ended("2026-12-01T10:05:00Z"),
        "lastState": _ended("2026-12-01T10:00:00Z", "Error"),
    }]))  # fmt: skip
    assert ended is not None
    assert (ended.pod, ended.node, ended.reason, ended.exit_code) == (
        "workers-a", "node-1", "OOMKilled", 137,
    )  # fmt: skip
    assert ended.finished_at == datetime(2026, 12, 1, 10, 5, tzinfo=UTC)
    assert ended.key == ("u-1", ended.finished_at)


def test_a_restarted_container_reports_its_predecessors_end() -> None:
    ended = terminated(_pod([{
        "name": "worker",
        "state": {"running": {"startedAt": "2026-12-01T10:05:01Z"}},
        "lastState": _ended("2026-12-01T10:05:00Z"),
    }]))  # fmt: skip
    assert ended is not None and ended.finished_at == datetime(2026, 12, 1, 10, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (_pod([{"name": "worker", "state": {"running": {}}, "lastState": {}}]), "running"),
        (_pod([{"name": "proxy", "state": _ended("2026-12-01T10:05:00Z")}]), "a sidecar ended"),
        (_pod([{"name": "worker", "state": {"terminated": {"reason": "Error"}}}]), "no time"),
        (_pod([{"name": "worker", "state": _ended("yesterday")}]), "a time unreadable"),
        (_pod([{"name": "worker", "state": _ended("2026-12-01T10:05:00")}]), "no time zone"),
        (
            _pod(
                [{"name": "worker", "state": _ended("2026-12-01T10:05:00Z")}],
                [{"name": "worker", "env": [DOWNWARD]}, {"name": "other", "env": [DOWNWARD]}],
            ),
            "two worker containers",
        ),
        (
            _pod(
                [{"name": "worker", "state": _ended("2026-12-01T10:05:00Z")}], [{"name": "worker"}]
            ),
            "no container registers the pod",
        ),
        (_pod([]), "no statuses yet"),
    ],
)
def test_nothing_else_confirms_an_end(pod: Any, why: str) -> None:
    assert terminated(pod) is None, why


def test_a_pod_never_scheduled_has_no_end() -> None:
    pod = _pod([{"name": "worker", "state": _ended("2026-12-01T10:05:00Z")}])
    del pod["spec"]["nodeName"]
    assert terminated(pod) is None
