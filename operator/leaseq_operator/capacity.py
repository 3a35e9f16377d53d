"""Which of a worker Deployment's pods take work and which are still loading, as pure functions.

A pod's state comes from the workers table: a worker registers as ``loading`` before its
``on_startup`` hook runs (a model load) and as ``running`` once it takes work. A pod with no
live worker row (not scheduled, image still pulling, or silent) is in neither list: the
scaling policy gives it the whole start-up time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from leaseq.core.models import WorkerRecord, WorkerState


@dataclass(frozen=True)
class PodStates:
    """The Deployment's pods by what their workers report."""

    active: int
    loading: tuple[float, ...]  # seconds each loading pod has been loading
    reported_startup_seconds: float | None  # mean on_startup time of the pool's workers


def pod_states(pods: Iterable[str], workers: Sequence[WorkerRecord]) -> PodStates:
    """Count ``pods`` whose live worker is running, and how long each loading one has loaded.

    A pod with a running worker is active even if another of its workers still loads;
    the reported start-up is the mean over live workers that finished loading, whatever pod.
    """
    live = [w for w in workers if not w.silent]
    by_pod: dict[str, list[WorkerRecord]] = {}
    for worker in live:
        by_pod.setdefault(worker.pod or "", []).append(worker)
    active, loading = 0, []
    for pod in pods:
        states = {WorkerState(w.state) for w in by_pod.get(pod, [])}
        if WorkerState.RUNNING in states:
            active += 1
        elif WorkerState.LOADING in states:
            ages = [w.age for w in by_pod[pod] if w.state == WorkerState.LOADING]
            loading.append(min(ages))
    return PodStates(
        active=active,
        loading=tuple(sorted(loading)),
        reported_startup_seconds=reported_startup(workers),
    )


def reported_startup(workers: Sequence[WorkerRecord]) -> float | None:
    """The mean ``on_startup`` time (model load) of the live ``workers`` that finished
    loading; None when none did."""
    startups = [
        w.startup_seconds for w in workers if not w.silent and w.startup_seconds is not None
    ]
    return statistics.fmean(startups) if startups else None
