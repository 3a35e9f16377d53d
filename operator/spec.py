"""A WorkerPool's spec, parsed and checked beyond what the CRD's schema can say.

The CRD (charts/leaseq/crds/workerpools.leaseq.dev.yaml) rejects malformed specs at the API
server and fills in defaults. :func:`parse` repeats those checks, with the same defaults, so a
spec that reached the operator some other way (an older CRD without the CEL rule, an emulator)
is still refused with a readable message rather than acted upon.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leaseq.core import validation
from leaseq.core.errors import InvalidJob, LeaseqError

GROUP = "leaseq.dev"
VERSION = "v1"
PLURAL = "workerpools"
KIND = "WorkerPool"

# The CRD's defaults; tests/unit/test_spec.py checks they match the CRD file.
DEFAULTS: Mapping[str, Any] = {
    "minReplicas": 0,
    "maxReplicas": 10,
    "jobsPerReplica": 1,
    "pollSeconds": 10,
    "scaleUpStabilizationSeconds": 0,
    "scaleDownStabilizationSeconds": 300,
}


class InvalidSpec(LeaseqError):
    """A WorkerPool spec the operator cannot act on; the message names the field."""


@dataclass(frozen=True)
class SecretRef:
    """A key of a Secret in the WorkerPool's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class PoolSpec:
    """A checked WorkerPool spec: every field present, every bound respected."""

    deployment: str
    queues: tuple[str, ...]
    min_replicas: int
    max_replicas: int
    jobs_per_replica: int
    poll_seconds: float
    scale_up_seconds: float
    scale_down_seconds: float
    database_secret: SecretRef | None = None


def _integer(spec: Mapping[str, Any], field: str, minimum: int) -> int:
    value = spec.get(field, DEFAULTS[field])
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidSpec(f"spec.{field} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidSpec(f"spec.{field} must be at least {minimum}, got {value}")
    return value


def _seconds(spec: Mapping[str, Any], field: str, *, positive: bool) -> float:
    value = spec.get(field, DEFAULTS[field])
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidSpec(f"spec.{field} must be a number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        bound = "greater than 0" if positive else "at least 0"
        raise InvalidSpec(f"spec.{field} must be {bound}, got {value}")
    return float(value)


def _string(spec: Mapping[str, Any], field: str, where: str) -> str:
    value = spec.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidSpec(f"{where}.{field} must be a non-empty string, got {value!r}")
    return value


def _queues(spec: Mapping[str, Any]) -> tuple[str, ...]:
    queues = spec.get("queues")
    if not isinstance(queues, list) or not queues:
        raise InvalidSpec(f"spec.queues must list at least one queue, got {queues!r}")
    for queue in queues:
        try:
            validation.queue_name(queue)
        except InvalidJob as exc:
            raise InvalidSpec(f"spec.queues has {queue!r}: {exc.problem}") from exc
    if len(set(queues)) != len(queues):
        raise InvalidSpec(f"spec.queues names a queue twice: {queues!r}")
    return tuple(queues)


def parse(spec: Mapping[str, Any]) -> PoolSpec:
    """The checked spec; raises :class:`InvalidSpec` with a message naming the first bad field."""
    min_replicas = _integer(spec, "minReplicas", 0)
    max_replicas = _integer(spec, "maxReplicas", 1)
    if max_replicas < min_replicas:
        raise InvalidSpec(
            f"spec.maxReplicas ({max_replicas}) must be greater than or equal to "
            f"spec.minReplicas ({min_replicas})"
        )
    secret = spec.get("databaseSecretRef")
    if secret is not None and not isinstance(secret, Mapping):
        raise InvalidSpec(f"spec.databaseSecretRef must be an object, got {secret!r}")
    return PoolSpec(
        deployment=_string(spec, "deployment", "spec"),
        queues=_queues(spec),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        jobs_per_replica=_integer(spec, "jobsPerReplica", 1),
        poll_seconds=_seconds(spec, "pollSeconds", positive=True),
        scale_up_seconds=_seconds(spec, "scaleUpStabilizationSeconds", positive=False),
        scale_down_seconds=_seconds(spec, "scaleDownStabilizationSeconds", positive=False),
        database_secret=None
        if secret is None
        else SecretRef(
            _string(secret, "name", "spec.databaseSecretRef"),
            _string(secret, "key", "spec.databaseSecretRef"),
        ),
    )
