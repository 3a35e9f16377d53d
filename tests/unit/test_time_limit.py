"""Every test phase has a time limit (tests/support/time_limit.py): a test that hangs, in its
body or in a fixture's teardown, fails with its stacks and the run goes on to the next."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

HANGING = """
import threading
import time

import pytest


@pytest.fixture
def stuck_teardown():
    yield
    threading.Event().wait()


def test_waits_for_an_event_never_set():
    threading.Event().wait()


def test_sleeps_for_an_hour():
    time.sleep(3600)


def test_hangs_in_teardown(stuck_teardown):
    pass


def test_after_the_hangs():
    pass
"""


def test_a_hanging_test_fails_at_its_limit_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from support.time_limit import (  # noqa: F401\n"
        "    pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown,\n"
        ")\n"
    )
    (tmp_path / "test_hangs.py").write_text(HANGING)
    # Not the outer run's PYTEST_ADDOPTS (a nested run's `-x tests/unit` would be read here).
    outer = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env = {**outer, "LEASEQ_TEST_TIME_LIMIT_SECONDS": "1", "PYTHONPATH": str(HERE)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,  # three hangs of 1 s each: far less unless the limit does not work
        env=env,
        cwd=tmp_path,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    # The teardown's test passed and then errored in teardown: it counts in both.
    assert "2 failed, 2 passed, 1 error" in out, out
    for phase, test in [
        ("call", "test_waits_for_an_event_never_set"),
        ("call", "test_sleeps_for_an_hour"),
        ("teardown", "test_hangs_in_teardown"),
    ]:
        assert f"{phase} of test_hangs.py::{test} still running after its 1 s limit" in out
    # Every thread's stack, in the failing test's captured output.
    assert "Captured stderr call" in out and "most recent call first" in out, out
