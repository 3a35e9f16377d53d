"""What a cluster does around the operator: uninstall, upgrade from a finalizer, pods without a
passwd entry, standby replicas, and how much the operator logs while idle.

``helm uninstall`` deletes the operator's Deployment, ServiceAccount, Role and RoleBinding at
the same moment as the WorkerPool, and deleting a namespace deletes everything in it at once:
no operator code can be counted on to run after the delete request. The emulator keeps
finalizer semantics (tests/k8s/emulator.py ``_delete``: an object with finalizers only gets a
deletionTimestamp), so a WorkerPool still carrying one stays Terminating here as on a real API
server.
"""

from __future__ import annotations

import base64
import logging
import pwd
from collections.abc import Mapping

import pytest
from harness import NAMESPACE, WORKERPOOLS, Api, StartOperator
from kubernetes.client.exceptions import ApiException

import leaseq
from leaseq.core.history import History
from leaseq.leader.history import PARTITIONS_AHEAD
from leaseq_operator.app import PoolState
from leaseq_operator.kube import POOL_LABEL
from support.polling import wait_for

pytestmark = pytest.mark.k8s

FINALIZER = "leaseq.dev/operator"
POOL = {"deployment": "workers", "queues": ["ocr"], "pollSeconds": 0.1}
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"


def _polls(pools: Mapping[str, PoolState], key: str, count: int) -> None:
    """Wait until the operator has polled the pool ``count`` more times."""
    seen: set[float | None] = set()

    def polled() -> bool:
        state = pools.get(key)
        seen.add(state.last_poll if state else None)
        return len(seen - {None}) > count

    wait_for(polled, what=f"{count} polls of {key}")


def _gone(api: Api, name: str) -> bool:
    try:
        api.pool(name)
    except ApiException as exc:
        return exc.status == 404
    return False


def _delete_pool(api: Api, name: str) -> None:
    api.custom.delete_namespaced_custom_object(*WORKERPOOLS[:2], NAMESPACE, WORKERPOOLS[2], name)


def test_uninstall_stops_the_operator_and_the_workerpool_still_goes(
    api: Api, start_operator: StartOperator
) -> None:
    api.create_deployment("workers", replicas=1, labels={POOL_LABEL: "ocr"})
    operator = start_operator(namespace="")
    api.create_pool("ocr", POOL)
    wait_for(lambda: api.pool("ocr").get("status", {}).get("desiredReplicas") is not None)

    # helm uninstall: the operator and its RBAC go in the same breath as the WorkerPool.
    operator.stop()
    _delete_pool(api, "ocr")
    assert _gone(api, "ocr"), api.pool("ocr")["metadata"]


def test_a_finalizer_left_by_an_earlier_version_is_removed(
    api: Api, start_operator: StartOperator
) -> None:
    api.create_deployment("workers", replicas=1)
    body = {
        "apiVersion": "leaseq.dev/v1",
        "kind": "WorkerPool",
        "metadata": {"name": "old", "finalizers": [FINALIZER]},
        "spec": POOL,
    }
    api.custom.create_namespaced_custom_object(*WORKERPOOLS[:2], NAMESPACE, WORKERPOOLS[2], body)
    operator = start_operator()  # the upgraded operator
    wait_for(
        lambda: not api.pool("old")["metadata"].get("finalizers"), what="old finalizer removed"
    )
    operator.stop()
    _delete_pool(api, "old")
    assert _gone(api, "old")


def test_operator_starts_as_a_user_without_a_passwd_entry(
    api: Api, start_operator: StartOperator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's uid (the image's 10001) has no passwd entry and no USER/LOGNAME."""

    def getpwuid(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for name in ("LOGNAME", "USER", "LNAME", "USERNAME", "POD_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    api.create_deployment("workers", replicas=0)
    start_operator()  # fails here if kopf asks getpass.getuser() for its identity
    api.create_pool("ocr", POOL)
    wait_for(lambda: api.pool("ocr").get("status", {}).get("desiredReplicas") is not None)


def test_standby_writes_no_status_even_when_the_database_fails(
    api: Api, start_operator: StartOperator, conn: leaseq.core.db.Conn
) -> None:
    # Another operator replica (not running here) holds the leader lease for the next hour.
    conn.execute(
        "INSERT INTO leaseq.leader_leases (name, holder, term, expires_at, holder_kind)"
        " VALUES ('reaper', 'the-leader', 7, now() + interval '1 hour', 'operator')"
    )
    api.core.create_namespaced_secret(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "elsewhere"},
            "data": {"url": base64.b64encode(UNREACHABLE.encode()).decode()},
        },
    )
    api.create_deployment("workers", replicas=0)
    standby = start_operator()
    api.create_pool("ocr", {**POOL, "databaseSecretRef": {"name": "elsewhere", "key": "url"}})
    _polls(standby.app.pools, f"{NAMESPACE}/ocr", 5)  # each one failing to read the database
    assert not standby.app.leading
    assert "status" not in api.pool("ocr")
    assert not api.events()


def test_idle_operator_logs_nothing_at_info(
    api: Api, start_operator: StartOperator, caplog: pytest.LogCaptureFixture, database_url: str
) -> None:
    # Idle means nothing to do: the history partitions the leader keeps ahead exist already
    # (which ones it must create depends on today's date, and creating them is logged).
    with leaseq.connect(database_url, action="test") as conn:
        History(conn).ensure_partitions(ahead=PARTITIONS_AHEAD, timeout=30)
    api.create_deployment("workers", replicas=0)
    operator = start_operator()
    api.create_pool("ocr", POOL)
    wait_for(lambda: api.pool("ocr").get("status", {}).get("desiredReplicas") is not None)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _polls(operator.app.pools, f"{NAMESPACE}/ocr", 10)
    noisy = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not noisy
