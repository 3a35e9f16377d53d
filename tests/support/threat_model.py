"""The threat model of leaseq's database roles (sql/leaseq_sql/definitions/threat_model.toml),
read once: what each component's role may do to each relation and function. The attack
suite, the role tests and the security guide's table all read it from here."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.catalog import DEFINITIONS

COMPONENTS = ("worker", "operator", "producer", "console")
# The order the catalogs' privileges are listed in (test_roles.observed_privileges).
ORDER = (
    "SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN", "USAGE"
)  # fmt: skip


@dataclass(frozen=True)
class Grant:
    """One privilege of a role on a relation: ``columns`` empty for the whole relation."""

    privilege: str
    columns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Grant:
        privilege, _, rest = text.partition(" (")
        return cls(privilege, tuple(c.strip() for c in rest.rstrip(")").split(",")) if rest else ())


@dataclass(frozen=True)
class Relation:
    name: str
    rls: bool
    decision: str | None
    maintain: bool
    grants: dict[str, tuple[Grant, ...]]
    rows: dict[str, str]


@functools.cache
def _raw() -> dict[str, Any]:
    return tomllib.loads(Path(DEFINITIONS / "threat_model.toml").read_text())


@functools.cache
def relations() -> dict[str, Relation]:
    """Every relation of schema leaseq the model decides, by name."""
    out = {}
    for name, spec in _raw()["relations"].items():
        out[name] = Relation(
            name=name,
            rls=bool(spec.get("rls", False)),
            decision=spec.get("decision"),
            maintain=bool(spec.get("maintain", False)),
            grants={
                c: tuple(Grant.parse(p) for p in spec[c]["privileges"])
                for c in COMPONENTS
                if c in spec
            },
            rows={c: spec[c].get("rows", "") for c in COMPONENTS if c in spec},
        )
    return out


def functions() -> dict[str, list[str]]:
    """Who may execute each function besides its owner ("PUBLIC": everyone)."""
    return {k: list(v) for k, v in _raw()["functions"].items()}


def privilege_lines(component: str, server_version: int) -> list[str]:
    """The component role's privileges as test_roles.observed_privileges lists them: the
    schema, then each relation's, then each column list's."""
    rels = relations()
    holds = [r for r in rels.values() if component in r.grants]
    lines = ["USAGE on schema leaseq"] if holds else []
    tables: list[tuple[str, int]] = []
    columns: list[tuple[str, str, tuple[str, ...]]] = []
    for r in holds:
        grants = list(r.grants[component])
        if component == "operator" and r.maintain and server_version >= 170000:
            grants.append(Grant("MAINTAIN"))
        for g in grants:
            if g.columns:
                columns.append((r.name, g.privilege, g.columns))
            else:
                tables.append((r.name, ORDER.index(g.privilege)))
    lines += [f"{ORDER[p]} on {name}" for name, p in sorted(tables)]
    lines += [f"{p} ({', '.join(cols)}) on {name}" for name, p, cols in sorted(columns)]
    return lines
