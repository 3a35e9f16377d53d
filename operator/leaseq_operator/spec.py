"""A WorkerPool's spec, parsed and checked beyond what the CRD's schema can say.

The CRD (charts/leaseq/crds/workerpools.leaseq.dev.yaml) rejects malformed specs at the API
server and fills in defaults. :func:`parse` repeats those checks, with the same defaults, so a
spec that reached the operator some other way (an older CRD without the CEL rule, an emulator)
is still refused with a readable message rather than acted upon.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

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
    "scaleOn": "Jobs",
    "work": {},
}

HOUR, DAY = 3600.0, 86400.0  # the CRD's maxima of spec.work's fields

# Defaults of spec.work's fields (the CRD defaults `work` to {} and then these).
WORK_DEFAULTS: Mapping[str, Any] = {
    "target": "DrainTime",
    "targetSeconds": 300,
    "startupSeconds": 30,
    "windowSeconds": 900,
    "defaultJobSeconds": 60,
}


class ScaleOn(StrEnum):
    """What a pool is sized from: job counts (the default) or estimated work-seconds."""

    JOBS = "Jobs"
    WORK = "Work"


class WorkTarget(StrEnum):
    """What ``work.targetSeconds`` bounds when a pool scales on work."""

    DRAIN_TIME = "DrainTime"  # the time to drain the ready, due-soon and running work
    OLDEST_READY_AGE = "OldestReadyAge"  # the age the oldest ready job reaches before it starts


E = TypeVar("E", bound=StrEnum)


class InvalidSpec(LeaseqError):
    """A WorkerPool spec the operator cannot act on; the message names the field."""


@dataclass(frozen=True)
class SecretRef:
    """A key of a Secret in the WorkerPool's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class WorkSpec:
    """How a pool that scales on work estimates and bounds its work (spec.work)."""

    target: WorkTarget = WorkTarget.DRAIN_TIME
    target_seconds: float = 300.0
    startup_seconds: float = 30.0
    window_seconds: float = 900.0
    default_job_seconds: float = 60.0


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
    scale_on: ScaleOn = ScaleOn.JOBS
    work: WorkSpec = field(default_factory=WorkSpec)
    scale_ahead_seconds: float | None = None  # None: the pool's start-up time


def _integer(spec: Mapping[str, Any], field: str, minimum: int) -> int:
    value = spec.get(field, DEFAULTS[field])
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidSpec(f"spec.{field} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidSpec(f"spec.{field} must be at least {minimum}, got {value}")
    return value


def _seconds(
    spec: Mapping[str, Any],
    field: str,
    *,
    positive: bool,
    where: str = "spec",
    defaults: Mapping[str, Any] = DEFAULTS,
    maximum: float = math.inf,
) -> float:
    value = spec.get(field, defaults[field])
    if not validation.finite_number(value):
        shown = validation.number_text(value)
        raise InvalidSpec(f"{where}.{field} must be a number of seconds, got {shown}")
    if value < 0 or (positive and value == 0):
        bound = "greater than 0" if positive else "at least 0"
        raise InvalidSpec(f"{where}.{field} must be {bound}, got {value}")
    if value > maximum:
        raise InvalidSpec(f"{where}.{field} must be at most {maximum:g}, got {value}")
    return float(value)


def _optional_seconds(spec: Mapping[str, Any], field: str, *, maximum: float) -> float | None:
    """A number of seconds (0 allowed) that may be left out: None when absent or null."""
    if spec.get(field) is None:
        return None
    return _seconds(spec, field, positive=False, defaults={field: None}, maximum=maximum)


def _choice(
    spec: Mapping[str, Any], field: str, kind: type[E], where: str, defaults: Mapping[str, Any]
) -> E:
    value = spec.get(field, defaults[field])
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(e.value for e in kind)
        raise InvalidSpec(f"{where}.{field} must be one of {allowed}, got {value!r}") from None


def _work(spec: Mapping[str, Any]) -> WorkSpec:
    work = spec.get("work", DEFAULTS["work"])
    if not isinstance(work, Mapping):
        raise InvalidSpec(f"spec.work must be an object, got {work!r}")

    def seconds(field: str, *, positive: bool, maximum: float) -> float:
        return _seconds(
            work,
            field,
            positive=positive,
            where="spec.work",
            defaults=WORK_DEFAULTS,
            maximum=maximum,
        )

    parsed = WorkSpec(
        target=_choice(work, "target", WorkTarget, "spec.work", WORK_DEFAULTS),
        target_seconds=seconds("targetSeconds", positive=True, maximum=DAY),
        startup_seconds=seconds("startupSeconds", positive=False, maximum=HOUR),
        window_seconds=seconds("windowSeconds", positive=True, maximum=DAY),
        default_job_seconds=seconds("defaultJobSeconds", positive=True, maximum=DAY),
    )
    if parsed.target_seconds <= parsed.startup_seconds:
        raise InvalidSpec(
            f"spec.work.targetSeconds ({parsed.target_seconds:g}) must be greater than "
            f"spec.work.startupSeconds ({parsed.startup_seconds:g}): a new pod must be able "
            "to work before the target"
        )
    return parsed


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
        scale_on=_choice(spec, "scaleOn", ScaleOn, "spec", DEFAULTS),
        work=_work(spec),
        scale_ahead_seconds=_optional_seconds(spec, "scaleAheadSeconds", maximum=HOUR),
    )
