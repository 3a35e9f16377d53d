"""The worker Deployment's replicas (issue 17): a new one starts at the WorkerPool's
minReplicas (0 when 0; without the field the API server defaults it to 1), and the field is
always rendered, read from the live Deployment when there is one (`lookup`), so an upgrade
neither resets the operator's scale nor drops the field (helm's three-way merge would then
delete it and the API server default it to 1). `helm template` has no cluster: lookup finds
nothing there, which is the install case."""

from __future__ import annotations

import pytest
from chartkit import Helm, one


@pytest.mark.parametrize("min_replicas", [0, 3])
def test_a_new_worker_deployment_starts_at_min_replicas(helm: Helm, min_replicas: int) -> None:
    objects = helm.render(sets={"worker.pool.minReplicas": str(min_replicas)})
    deployment = one(objects, "Deployment", "worker")
    assert deployment["spec"]["replicas"] == min_replicas
    assert one(objects, "WorkerPool")["spec"]["minReplicas"] == min_replicas
