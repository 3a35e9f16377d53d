"""``leaseq console`` as a real process on a free loopback port, for tests that go through its
HTTP server (uvicorn) rather than an in-process client."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from support import net
from support.polling import wait_for


class ConsoleProcess:
    """``leaseq console --port P FLAGS...`` connected with ``url``, its output in ``log``;
    started once it answers /healthz."""

    def __init__(
        self, url: str, log: Path, *flags: str, env: Mapping[str, str] | None = None
    ) -> None:
        self.port = net.free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        environ = {**os.environ, "LEASEQ_DATABASE_URL": url, **(env or {})}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "leaseq.cli", "console", "--port", str(self.port), *flags],
                env=environ, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.log = log
        wait_for(self._up, "the console to answer /healthz")

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            return net.get(self.base + "/healthz")[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
