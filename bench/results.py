"""Writing raw results: one CSV per table, each row stamped with where and how it was measured."""

from __future__ import annotations

import csv
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Row = Mapping[str, Any]

# Stamped on every row so a CSV file on its own says what produced it.
STAMP = ("run_at", "mode", "cores", "cpu_model", "pg_version")


@dataclass
class Recorder:
    """Writes one scenario's tables to ``<folder>/<table>.csv`` (replacing earlier runs) and its
    environment (machine, server parameters, scenario parameters) to ``<scenario>_env.csv``."""

    folder: Path
    scenario: str
    mode: str
    environment: dict[str, str]
    run_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def stamp(self) -> dict[str, str]:
        return {
            "run_at": self.run_at,
            "mode": self.mode,
            "cores": self.environment.get("cores", ""),
            "cpu_model": self.environment.get("cpu_model", ""),
            "pg_version": self.environment.get("pg_version", ""),
        }

    def table(self, name: str, rows: Sequence[Row]) -> Path:
        """Write ``rows`` (all stamped) to ``<name>.csv``; the header is the union of keys."""
        clash = {key for row in rows for key in row if key in STAMP}
        if clash:
            raise ValueError(f"columns {sorted(clash)} are reserved for the stamp")
        self.folder.mkdir(parents=True, exist_ok=True)
        stamped = [{**self.stamp(), **row} for row in rows]
        columns = list(STAMP)
        for row in stamped:
            columns.extend(key for key in row if key not in columns)
        path = self.folder / f"{name}.csv"
        with path.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=columns)
            writer.writeheader()
            writer.writerows(stamped)
        return path

    def params(self, params: Mapping[str, Any]) -> Path:
        """Write the environment and this scenario's parameters as key,value rows."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.scenario}_env.csv"
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["key", "value"])
            writer.writerow(["run_at", self.run_at])
            writer.writerow(["mode", self.mode])
            for key, value in {
                **self.environment,
                **{f"param.{k}": v for k, v in params.items()},
            }.items():
                writer.writerow([key, value])
        return path


def read(path: Path) -> list[dict[str, str]]:
    """All rows of one CSV file as dicts of strings (empty when the file is missing)."""
    if not path.exists():
        return []
    with path.open(newline="") as source:
        return list(csv.DictReader(source))
