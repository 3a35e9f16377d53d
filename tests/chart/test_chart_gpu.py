"""GPU pools: extended resources in the worker's requests and limits, scheduling onto GPU
nodes (nodeSelector, tolerations, affinity, runtimeClassName, priorityClassName) and extra
volumes for model caches. ci/gpu-values.yaml is also rendered, linted, scanned and validated
against the Kubernetes schemas with every other ci/ example."""

from __future__ import annotations

import pytest
from chartkit import CHART, Helm, Obj, one

GPU_VALUES = CHART / "ci" / "gpu-values.yaml"


def worker_pod(objs: list[Obj]) -> Obj:
    spec: Obj = one(objs, "Deployment", "worker")["spec"]["template"]["spec"]
    return spec


def test_gpu_values_schedule_workers_onto_gpus(helm: Helm) -> None:
    pod = worker_pod(helm.render(GPU_VALUES))
    (container,) = pod["containers"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "gpu-inference"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert "nodeAffinity" in pod["affinity"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "ocr-models"
    assert "tmp" in volumes  # the chart's own volume stays
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"tmp": "/tmp", "model-cache": "/models"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LEASEQ_APP"] == "leaseq.examples.ocr:registry"
    assert env["OCR_DEVICE"] == "cuda"


def test_defaults_set_no_gpu_scheduling(helm: Helm) -> None:
    pod = worker_pod(helm.render())
    for key in ("runtimeClassName", "priorityClassName", "nodeSelector", "tolerations"):
        assert key not in pod
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915"])
def test_any_extended_resource_is_accepted(helm: Helm, resource: str) -> None:
    key = resource.replace(".", "\\.")
    objs = helm.render(
        sets={f"worker.resources.requests.{key}": "2", f"worker.resources.limits.{key}": "2"}
    )
    (container,) = worker_pod(objs)["containers"]
    assert container["resources"]["limits"][resource] == 2


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        # helm names the key as a JSON pointer ("/" is "~1")
        ({"worker.resources.limits.nvidia\\.com/gpu": "0.5"}, "limits/nvidia.com~1gpu"),
        ({"worker.resources.limits.gpu": "1"}, "gpu"),  # not vendor-qualified: unknown key
        (
            {
                "worker.resources.requests.nvidia\\.com/gpu": "1",
                "worker.resources.limits.nvidia\\.com/gpu": "2",
            },
            "worker.resources: requests.nvidia.com/gpu (1) must equal limits.nvidia.com/gpu "
            "(2): extended resources cannot be overcommitted",
        ),
        ({"worker.runtimeClassName": "Not_A_Name"}, "runtimeClassName"),
    ],
)
def test_bad_gpu_settings_are_refused_by_name(helm: Helm, sets: dict[str, str], error: str) -> None:
    proc = helm.template_raw(sets=sets, check=False)
    assert proc.returncode != 0
    assert error in proc.stderr
