"""The WorkerPool CRD's schema (as an API server applies it) and the operator's own spec check.

The emulator does not validate objects, so this is where the CRD's openAPIV3Schema is proven:
structural checks with a JSON-schema validator (OpenAPI 3.0 schemas are draft-4 style), the
CRD's defaults applied as the API server does, then its CEL rules evaluated with cel-python.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from leaseq_operator.spec import (
    DEFAULTS,
    WORK_DEFAULTS,
    InvalidSpec,
    PoolSpec,
    ScaleOn,
    SecretRef,
    WorkSpec,
    WorkTarget,
    parse,
)

CRD_PATH = Path(__file__).parents[2] / "charts" / "leaseq" / "crds" / "workerpools.leaseq.dev.yaml"
CRD = yaml.safe_load(CRD_PATH.read_text())
[VERSION] = CRD["spec"]["versions"]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = SCHEMA["properties"]["spec"]

GOOD: dict[str, Any] = {"deployment": "workers", "queues": ["ocr"]}


def _defaulted(value: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(value)
    for name, prop in schema.get("properties", {}).items():
        if name not in out and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
        if isinstance(out.get(name), dict) and prop.get("type") == "object":
            out[name] = _defaulted(out[name], prop)
    return out


def with_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """Structural defaulting as the API server does it: absent fields get the schema's
    defaults, then objects (defaulted ones too) get their own fields' defaults."""
    return _defaulted(spec, SPEC_SCHEMA)


def api_server_errors(spec: dict[str, Any]) -> list[str]:
    """What the API server would refuse the WorkerPool for (empty: accepted)."""
    body = {"apiVersion": "leaseq.dev/v1", "kind": "WorkerPool", "spec": with_defaults(spec)}
    validator = jsonschema.Draft4Validator(SCHEMA)
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)
    ]
    if errors:
        return errors
    env = celpy.Environment()
    for rule in SPEC_SCHEMA.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(body["spec"])}):
            errors.append(rule["message"])
    return errors


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({**GOOD, "minReplicas": 5, "maxReplicas": 2}, "maxReplicas must be greater than or"),
        ({**GOOD, "maxReplicas": 0}, "maxReplicas: 0 is less than the minimum of 1"),
        ({**GOOD, "queues": ["\x1b[2Jq"]}, "does not match '^[A-Za-z0-9][A-Za-z0-9._:-]*$'"),
        ({**GOOD, "minReplicas": -1}, "minReplicas: -1 is less than the minimum of 0"),
        ({**GOOD, "jobsPerReplica": 0}, "jobsPerReplica: 0 is less than the minimum of 1"),
        ({**GOOD, "pollSeconds": 0}, "pollSeconds: 0 is less than or equal to the minimum"),
        ({**GOOD, "scaleDownStabilizationSeconds": -5}, "scaleDownStabilizationSeconds: -5"),
        ({**GOOD, "scaleUpStabilizationSeconds": -1}, "scaleUpStabilizationSeconds: -1"),
        ({**GOOD, "queues": []}, "queues: [] should be non-empty"),
        ({**GOOD, "queues": [""]}, "queues.0: '' should be non-empty"),
        ({"queues": ["ocr"]}, "'deployment' is a required property"),
        ({**GOOD, "minReplicas": 1.5}, "minReplicas: 1.5 is not of type 'integer'"),
        ({**GOOD, "databaseSecretRef": {"name": "db"}}, "'key' is a required property"),
        ({**GOOD, "scaleOn": "Bytes"}, "scaleOn: 'Bytes' is not one of ['Jobs', 'Work']"),
        ({**GOOD, "work": {"target": "Soon"}}, "work.target: 'Soon' is not one of"),
        ({**GOOD, "work": {"targetSeconds": 0}}, "work.targetSeconds: 0 is less than or equal"),
        ({**GOOD, "work": {"startupSeconds": -1}}, "work.startupSeconds: -1 is less than"),
        ({**GOOD, "work": {"windowSeconds": 0}}, "work.windowSeconds: 0 is less than or equal"),
        ({**GOOD, "work": {"defaultJobSeconds": 0}}, "work.defaultJobSeconds: 0 is less than"),
        ({**GOOD, "work": {"targetSeconds": 90000}}, "work.targetSeconds: 90000 is greater"),
        ({**GOOD, "scaleAheadSeconds": -1}, "scaleAheadSeconds: -1 is less than the minimum"),
        ({**GOOD, "scaleAheadSeconds": 3601}, "scaleAheadSeconds: 3601 is greater than"),
        (
            {**GOOD, "work": {"targetSeconds": 30, "startupSeconds": 30}},
            "work.targetSeconds must be greater than work.startupSeconds",
        ),
    ],
)
def test_crd_schema_refuses_bad_specs(spec: dict[str, Any], complaint: str) -> None:
    errors = api_server_errors(spec)
    assert any(complaint in e for e in errors), errors
    with pytest.raises(InvalidSpec):
        parse(with_defaults(spec))  # the operator refuses whatever the schema refuses


def test_crd_schema_accepts_good_specs() -> None:
    assert api_server_errors(GOOD) == []
    full = {
        **GOOD,
        "minReplicas": 0,
        "maxReplicas": 0 + 1,
        "jobsPerReplica": 4,
        "pollSeconds": 0.5,
        "scaleUpStabilizationSeconds": 0,
        "scaleDownStabilizationSeconds": 600,
        "databaseSecretRef": {"name": "db", "key": "url"},
        "scaleAheadSeconds": 0,
    }
    assert api_server_errors(full) == []
    assert parse(full).database_secret == SecretRef("db", "url")
    assert parse(full).scale_ahead_seconds == 0.0
    assert parse(GOOD).scale_ahead_seconds is None  # unset: the pool's start-up time
    work = {
        **GOOD,
        "scaleOn": "Work",
        "work": {"target": "OldestReadyAge", "targetSeconds": 120, "startupSeconds": 0},
    }
    assert api_server_errors(work) == []
    parsed = parse(with_defaults(work))
    assert parsed.scale_on is ScaleOn.WORK
    assert parsed.work == WorkSpec(WorkTarget.OLDEST_READY_AGE, 120.0, 0.0, 900.0, 60.0)


def test_operator_defaults_are_the_crds() -> None:
    assert with_defaults({}) == {**DEFAULTS, "work": dict(WORK_DEFAULTS)}
    assert parse(GOOD) == PoolSpec(
        deployment="workers",
        queues=("ocr",),
        min_replicas=0,
        max_replicas=10,
        jobs_per_replica=1,
        poll_seconds=10.0,
        scale_up_seconds=0.0,
        scale_down_seconds=300.0,
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({**GOOD, "queues": ["ocr", "ocr"]}, "spec.queues names a queue twice: ['ocr', 'ocr']"),
        ({**GOOD, "queues": ["x" * 129]}, "is 129 characters long; the limit is 128"),
        ({**GOOD, "queues": ["a\nb"]}, "is not a queue name: 1-128 characters of letters"),
        ({**GOOD, "maxReplicas": True}, "spec.maxReplicas must be an integer, got True"),
        ({**GOOD, "pollSeconds": "10s"}, "spec.pollSeconds must be a number of seconds, got '10s'"),
        ({**GOOD, "deployment": ""}, "spec.deployment must be a non-empty string, got ''"),
        ({**GOOD, "databaseSecretRef": "db"}, "spec.databaseSecretRef must be an object"),
        ({**GOOD, "work": []}, "spec.work must be an object, got []"),
        ({**GOOD, "scaleOn": "work"}, "spec.scaleOn must be one of Jobs, Work, got 'work'"),
        ({**GOOD, "scaleAheadSeconds": "1m"}, "spec.scaleAheadSeconds must be a number of"),
        # An int beyond a float: math.isfinite raised OverflowError on it.
        (
            {**GOOD, "pollSeconds": 10**400},
            "spec.pollSeconds must be a number of seconds, got an integer of 1329 bits",
        ),
        (
            {**GOOD, "work": {"windowSeconds": -(10**5000)}},
            "spec.work.windowSeconds must be a number of seconds, got an integer of 16610 bits",
        ),
        ({**GOOD, "scaleAheadSeconds": float("nan")}, "must be a number of seconds, got NaN"),
        (
            {**GOOD, "work": {"targetSeconds": 20}},
            "spec.work.targetSeconds (20) must be greater than spec.work.startupSeconds (30)",
        ),
    ],
)
def test_operator_refuses_what_the_schema_cannot_say(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse(spec)
    assert message in str(refused.value)


def test_printer_columns_point_at_real_fields() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
    for column in VERSION["additionalPrinterColumns"]:
        path = column["jsonPath"].split("[")[0].lstrip(".").split(".")
        section, field = path[0], path[1]
        if section == "spec":
            assert field in SPEC_SCHEMA["properties"], column
        elif section == "status":
            assert field in status, column
    assert VERSION["subresources"] == {"status": {}}
