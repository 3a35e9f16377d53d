"""What every scenario gets: the server, the size of the run, and where its results go."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.results import Recorder


@dataclass(frozen=True)
class Context:
    """``quick`` runs the smallest configurations that still show each effect."""

    server_url: str
    quick: bool
    folder: Path
    environment: dict[str, str]
    churn_arms: tuple[str, ...] = ("leaseq", "control")
    #: The peers scenario's arms to run (by name); empty: all of them.
    peers: tuple[str, ...] = ()

    def recorder(self, scenario: str) -> Recorder:
        return Recorder(self.folder, scenario, "quick" if self.quick else "full", self.environment)

    def log(self, message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
