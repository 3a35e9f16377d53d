"""Handlers by job type, and start-up hooks, loaded from an import path (``pkg.module:name``).

::

    registry = leaseq.Registry()

    @registry.on_startup
    def load_model() -> None:
        MODEL.update(weights=load_weights())      # once per process, before any claim

    @registry.job("ocr", progress_timeout=120)
    def ocr(payload, ctx):
        ...
        return {"pages": 12}                     # stored as the job's result and effect

``leaseq worker --app mypkg.jobs:registry`` loads it with :func:`load_app`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leaseq.core import validation
from leaseq.core.errors import ConfigError, InvalidJob

if TYPE_CHECKING:
    from leaseq.runtime.context import JobContext

Handler = Callable[[Any, "JobContext"], Any]
StartupHook = Callable[[], None]


@dataclass(frozen=True)
class JobType:
    """A registered handler. ``progress_timeout``: when set, the worker stops renewing the
    lease and fails the attempt (error code ``NO_PROGRESS``, retried per policy) if the
    handler reported no progress for that many seconds."""

    name: str
    handler: Handler
    progress_timeout: float | None = None


class Registry:
    """Job types a worker can run, and hooks to run once per process before the first claim."""

    def __init__(self) -> None:
        self._types: dict[str, JobType] = {}
        self._startup: list[StartupHook] = []

    def job(
        self, job_type: str, *, progress_timeout: float | None = None
    ) -> Callable[[Handler], Handler]:
        """Decorator registering ``handler(payload, ctx)`` for ``job_type``.

        The handler's return value (JSON) is the job's result; an exception fails the attempt
        (retried with backoff; :class:`leaseq.PermanentError` goes straight to dead).
        Raises ConfigError for a bad or duplicate name.
        """
        try:
            validation.name("job_type", job_type)
            if progress_timeout is not None:
                validation.positive("progress_timeout", progress_timeout)
        except InvalidJob as exc:
            raise ConfigError(str(exc)) from exc
        if job_type in self._types:
            raise ConfigError(f"job type {job_type!r} is registered twice")

        def register(handler: Handler) -> Handler:
            self._types[job_type] = JobType(job_type, handler, progress_timeout)
            return handler

        return register

    def on_startup(self, hook: StartupHook) -> StartupHook:
        """Decorator: run ``hook()`` once per worker process before it claims anything (load
        models here, not in the handler)."""
        self._startup.append(hook)
        return hook

    def run_startup(self) -> None:
        """Run the start-up hooks in registration order; an exception propagates."""
        for hook in self._startup:
            hook()

    def get(self, job_type: str) -> JobType | None:
        return self._types.get(job_type)

    @property
    def job_types(self) -> list[str]:
        return sorted(self._types)


def load_app(path: str) -> Registry:
    """Import ``module:attribute`` and return that :class:`Registry`; ConfigError says what
    is wrong with the path otherwise."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"--app {path!r} must look like 'package.module:registry'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {path!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        found = getattr(module, attribute)
    except AttributeError as exc:
        raise ConfigError(f"--app {path!r}: module {module_name!r} has no {attribute!r}") from exc
    if not isinstance(found, Registry):
        raise ConfigError(
            f"--app {path!r}: {attribute!r} is a {type(found).__name__}, not a leaseq.Registry"
        )
    return found
