"""`leaseq demo --pipeline` end to end: split, a job per page, merge, a worker SIGKILLed
during the fan-in; every check must hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.demo]


def test_pipeline_demo_runs_and_every_check_holds(database_url: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "leaseq.cli",
            "demo",
            "--pipeline",
            "--documents",
            "3",
            "--pages",
            "4",
            "--database-url",
            database_url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert "SIGKILL" in done.stdout and "during the fan-in" in done.stdout
    assert "all checks hold" in done.stdout
    assert "FAIL" not in done.stdout
