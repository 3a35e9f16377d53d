"""Waiting on a condition with a deadline: the tests' only way to wait for another process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str = "", timeout: float = 30.0) -> T:
    """Poll ``check`` until it returns something truthy (returned); an AssertionError inside
    counts as not yet. At the deadline, fail naming ``what`` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except AssertionError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what or check}; last: {last!r}")
        time.sleep(0.05)
