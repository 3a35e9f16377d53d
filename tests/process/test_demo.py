"""`leaseq demo` end to end: it must account for every job and exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.demo]


def test_demo_runs_and_every_invariant_holds(database_url: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "leaseq.cli", "demo", "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert "all invariants hold" in done.stdout
    assert "FAIL" not in done.stdout
