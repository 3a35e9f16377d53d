"""podman as the image tests call it: the flags, a container handle, the numbers measured."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/leaseq:image-test"
PYTHON_VERSION = "3.11"
BASE = f"docker.io/library/python:{PYTHON_VERSION}-slim-bookworm"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
# What every container gets, as the chart's pods do (and the flags this sandbox needs).
RUN_FLAGS = [
    "--network=host",
    "--ulimit=nofile=4096:4096",
    "--ulimit=nproc=4096:4096",
    "--user=10001:10001",
    "--passwd=false",
    "--read-only",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
]
#: Numbers the layer measured, printed at the end of the session.
MEASURED: dict[str, str] = {}


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    """Run podman; its stdout, or fail the test with its output."""
    proc = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


@dataclass
class Container:
    name: str

    def inspect(self) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(podman("inspect", self.name))
        return found[0]

    def logs(self) -> str:
        """What the container wrote, stdout and stderr."""
        proc = subprocess.run(
            [*PODMAN, "logs", self.name], capture_output=True, text=True, timeout=60, check=False
        )
        return proc.stdout + proc.stderr

    @property
    def running(self) -> bool:
        return bool(self.inspect()["State"]["Running"])
