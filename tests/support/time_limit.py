"""A time limit on every phase of every test (setup, call, teardown): a hang fails the test,
with every thread's stack, instead of stopping the run for ever. tests/conftest.py takes
these hooks in.

The limit is raised in the main thread by SIGALRM (every blocking call a test makes there,
``time.sleep``, a lock, a socket, a child's ``wait``, a libpq wait, gives way to it); should
the main thread be stuck where no signal handler can run, the interpreter is ended
``BACKSTOP_SECONDS`` later with the stacks printed. docs/tests.md says what the limits are.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

#: Seconds one phase of a test may take (LEASEQ_TEST_TIME_LIMIT_SECONDS overrides it). The
#: slowest tests outside the layers below take well under a minute on a loaded 2-core
#: machine: five minutes only ever stops a hang.
TIME_LIMIT_SECONDS = float(os.environ.get("LEASEQ_TEST_TIME_LIMIT_SECONDS") or 300.0)
#: The layers slow by design, by marker (the longest wins): fault runs of a few minutes,
#: image builds, kind clusters and fresh virtualenvs running the whole suite (its own
#: commands are bounded at an hour).
LIMITS_BY_MARKER = {"faults": 900.0, "image": 7200.0, "e2e": 7200.0, "slow": 7200.0}
#: How long after the limit a main thread that cannot take the signal ends the run.
BACKSTOP_SECONDS = 60.0


def time_limit(item: pytest.Item) -> float:
    """The seconds each phase of ``item`` may take."""
    return max(
        (LIMITS_BY_MARKER[m.name] for m in item.iter_markers() if m.name in LIMITS_BY_MARKER),
        default=TIME_LIMIT_SECONDS,
    )


@contextmanager
def limited(item: pytest.Item, phase: str) -> Iterator[None]:
    """Fail ``item`` if ``phase`` is still running after its time limit."""
    seconds = time_limit(item)

    def expire(signum: int, frame: FrameType | None) -> None:
        faulthandler.dump_traceback(file=sys.__stderr__ or sys.stderr, all_threads=True)
        pytest.fail(f"{phase} of {item.nodeid} still running after its {seconds:g} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + BACKSTOP_SECONDS, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with limited(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with limited(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    with limited(item, "teardown"):
        return (yield)
