"""What a handler raises to say how its attempt ends, other than by failing: its own module
so that the context and the steps (:mod:`leaseq.runtime.steps`) share them without importing
each other."""

from __future__ import annotations

from datetime import datetime


class PermanentError(Exception):
    """Raise from a handler when retrying cannot help (bad input): the job goes to ``dead`` at
    once with this message as its last error."""


class Interrupted(Exception):
    """Raise from a handler to hand the job back without spending an attempt, e.g. after
    saving a checkpoint when :attr:`JobContext.draining` is set. If the worker has already
    given the job up (``should_stop``), nothing more is reported."""


class BackOff(Interrupted):
    """Raise from a handler when the service it calls says to back off (HTTP 429,
    Retry-After): the job is handed back without spending an attempt, to run no sooner than
    ``seconds`` from now, and its flow-control key (if it has one) is paused until then, so no
    worker starts another job of that key meanwhile."""

    def __init__(self, seconds: float, reason: str = "told to back off") -> None:
        super().__init__(f"{reason} for {seconds:g}s")
        self.seconds = float(seconds)
        self.reason = reason


class Suspended(BaseException):
    """What ``ctx.sleep``, ``ctx.sleep_until`` and ``ctx.wait_for`` raise to end the attempt
    (not raised by handlers). Not an :class:`Exception`, as Python's own ``GeneratorExit`` and
    asyncio's ``CancelledError`` are not: a handler's ``except Exception`` around its work
    lets it through. A handler that catches it anyway and returns (or raises something else)
    still ends its attempt as the sleep or wait it asked for, never as a success."""


class Sleeping(Suspended):
    """Raised by ``ctx.sleep`` and ``ctx.sleep_until`` (not by handlers): the attempt ends and
    the job is handed back without spending an attempt, holding nothing, claimable again at
    ``until`` (database time), when the handler runs again from the start. Let it propagate."""

    def __init__(self, until: datetime) -> None:
        super().__init__(f"sleeping until {until.isoformat()}")
        self.until = until


class Waiting(Suspended):
    """Raised by ``ctx.wait_for`` (not by handlers) when the signal ``name`` has not been sent:
    the attempt ends and the job is handed back without spending an attempt, holding
    nothing, claimable again when the signal arrives or at ``until`` (the wait's deadline,
    database time), when the handler runs again from the start. Let it propagate."""

    def __init__(self, name: str, until: datetime) -> None:
        super().__init__(f"waiting for signal {name!r} until {until.isoformat()}")
        self.name = name
        self.until = until
