"""Named SQL statements, parsed once from the ``queries/*.sql`` files shipped in ``leaseq_sql``.

A block starts with ``-- name: NAME``; the next comment line describes it; the rest, up to
the next block, is the statement, written whole. No SQL is written anywhere else in the
runtime.

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

_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Statement:
    """One named statement: its name, one-line description and query text."""

    name: str
    description: str
    query: bytes


def _lines(name: str, body: str) -> tuple[str, list[str]]:
    """A block's description and its lines of SQL, stripped, comments left out."""
    lines = body.splitlines()
    if not lines or not lines[0].startswith("-- "):
        raise ValueError(f"statement {name} has no description line")
    kept = (line.strip() for line in lines[1:])
    return lines[0][3:].strip(), [line for line in kept if line and not line.startswith("--")]


def parse(text: str) -> dict[str, Statement]:
    """Parse one file of named blocks; raises ValueError on a duplicate or empty block."""
    found: dict[str, Statement] = {}
    marks = list(_BLOCK.finditer(text))
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        name = mark.group(1)
        body = text[mark.end() : following.start() if following else len(text)].strip()
        description, sql = _lines(name, body)
        if name in found:
            raise ValueError(f"statement {name} is defined twice")
        query = "\n".join(sql).rstrip(";").strip()
        if not query:
            raise ValueError(f"statement {name} is empty")
        found[name] = Statement(name, description, query.encode())
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
