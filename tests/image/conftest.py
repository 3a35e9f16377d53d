"""The image layer: the Dockerfile built once per session with podman, run against the test
PostgreSQL as a pod runs it (uid 10001 without a passwd entry, read-only root filesystem,
every capability dropped).

The base image `python:3.11-slim-bookworm` is pulled; where no registry answers,
scripts/podman-base-image.sh builds a stand-in from Debian packages under that name, once per
machine (podman keeps it; later sessions find it). The Dockerfile keeps its real base. The
flags (runc, cgroupfs, rlimits, host network) suit machines without Docker, such as CI here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from podmankit import (
    BASE,
    IMAGE,
    MEASURED,
    PODMAN,
    PYTHON_VERSION,
    REPO,
    RUN_FLAGS,
    Container,
    podman,
)
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from support.unixproxy import UnixProxy


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MEASURED:
        terminalreporter.write_sep("-", "image layer")
        for name, value in MEASURED.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture(scope="session")
def image() -> str:
    """The leaseq image, built from the Dockerfile once per session."""
    if shutil.which("podman") is None:
        pytest.skip("podman not found: apt-get install podman runc uidmap (see .ci/run)")
    started = time.monotonic()
    present = subprocess.run([*PODMAN, "image", "exists", BASE], check=False).returncode == 0
    if present:
        MEASURED["base image"] = "present"
    elif podman("pull", "--quiet", BASE, timeout=600, check=False):
        MEASURED["base image"] = f"pulled in {time.monotonic() - started:.0f} s"
    elif shutil.which("mmdebstrap"):  # no registry: the stand-in, built once per machine
        subprocess.run(
            [str(REPO / "scripts" / "podman-base-image.sh")],
            check=True,
            env={**os.environ, "LEASEQ_BASE_IMAGE": BASE},
            timeout=900,
        )
        MEASURED["base image"] = (
            f"no registry: stand-in built in {time.monotonic() - started:.0f} s"
        )
    else:
        pytest.fail(f"{BASE} cannot be pulled, and mmdebstrap is missing to build a stand-in")
    started = time.monotonic()
    podman(
        "build",
        "--network=host",
        f"--build-arg=PYTHON_VERSION={PYTHON_VERSION}",
        "-t",
        IMAGE,
        str(REPO),
        timeout=900,
    )
    MEASURED["image build"] = f"{time.monotonic() - started:.1f} s"
    return IMAGE


@pytest.fixture(scope="session")
def reachable(server_url: str) -> Iterator[Callable[[str], str]]:
    """Rewrites a test database URL into one a container on the host network can use: a
    Unix-socket server (the embedded one) is reached through a loopback TCP forwarder."""
    host = conninfo_to_dict(server_url).get("host") or ""
    if not host.startswith("/"):
        yield lambda url: url
        return
    port = conninfo_to_dict(server_url).get("port") or "5432"
    with UnixProxy(f"{host}/.s.PGSQL.{port}") as proxy:
        yield lambda url: make_conninfo(url, host="127.0.0.1", port=str(proxy.port))


@pytest.fixture
def run_container(image: str) -> Iterator[Callable[..., Container]]:
    """Start a detached container of the image (RUN_FLAGS plus ``flags``); removed after."""
    started: list[Container] = []

    def start(*args: str, env: dict[str, str], flags: tuple[str, ...] = ()) -> Container:
        name = f"leaseq-test-{uuid.uuid4().hex[:8]}"
        environment = [f"--env={k}={v}" for k, v in env.items()]
        podman("run", "--detach", f"--name={name}", *RUN_FLAGS, *environment, *flags, image, *args)
        container = Container(name)
        started.append(container)
        return container

    yield start
    for container in started:
        podman("rm", "--force", "--time=0", container.name, check=False)
