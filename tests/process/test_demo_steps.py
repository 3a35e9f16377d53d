"""`leaseq demo --steps` end to end: agent jobs with two paid calls as durable steps, a
worker SIGKILLed between the two; every check must hold (no call paid twice)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.demo]


def test_steps_demo_runs_and_every_check_holds(database_url: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "leaseq.cli", "demo", "--steps", "--documents", "3",
         "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )  # fmt: skip
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert "answer billed and not recorded" in done.stdout
    assert "every paid call was billed exactly once: 6 bills for 6 calls" in done.stdout
    assert "all checks hold" in done.stdout
    assert "FAIL" not in done.stdout
