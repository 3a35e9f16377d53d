"""Named SQL statements, parsed once from the ``queries/*.sql`` files shipped in ``leaseq_sql``.

A block starts with ``-- name: NAME``; the next comment line describes it; the rest, up to
the next block, is the statement. No SQL is written anywhere else in the runtime.

A statement is loaded without its comment lines and indentation: psycopg converts a query's
``%(name)s`` placeholders once per process only for texts of at most 4,096 bytes, and
converted every call of a longer one again (0.09 ms of client CPU per keyed claim, whose
commented text was 5,210 bytes). The comments stay in the files, where they are read.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Statement:
    """One named statement: its name, one-line description and query text."""

    name: str
    description: str
    query: bytes


def parse(text: str) -> dict[str, Statement]:
    """Parse one file of named blocks; raises ValueError on a duplicate or empty block."""
    found: dict[str, Statement] = {}
    marks = list(_NAME.finditer(text))
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        body = text[mark.end() : following.start() if following else len(text)].strip()
        lines = body.splitlines()
        if not lines or not lines[0].startswith("-- "):
            raise ValueError(f"statement {mark.group(1)} has no description line")
        kept = (line.strip() for line in lines[1:])
        query = "\n".join(line for line in kept if line and not line.startswith("--"))
        query = query.rstrip(";").strip()
        if not query:
            raise ValueError(f"statement {mark.group(1)} is empty")
        if mark.group(1) in found:
            raise ValueError(f"statement {mark.group(1)} is defined twice")
        found[mark.group(1)] = Statement(mark.group(1), lines[0][3:].strip(), query.encode())
    return found


@functools.cache
def load() -> dict[str, Statement]:
    """Every named statement shipped with leaseq, loaded once per process."""
    found: dict[str, Statement] = {}
    folder = resources.files("leaseq_sql").joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            for name, statement in parse(entry.read_text(encoding="utf-8")).items():
                if name in found:
                    raise ValueError(f"statement {name} is defined in two files")
                found[name] = statement
    return found
