"""The named statements as loaded: what psycopg is sent, and what it can cache."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from psycopg import _queries

from leaseq.core._store import statements


def test_every_statement_is_short_enough_for_psycopg_to_convert_it_once() -> None:
    """psycopg converts a query's %(name)s placeholders once per process (an LRU cache) only
    for texts up to MAX_CACHED_STATEMENT_LENGTH bytes with at most MAX_CACHED_STATEMENT_PARAMS
    parameters; a longer one is split and converted again at every call (psycopg 3,
    psycopg/_queries.py, PostgresQuery.convert). The keyed claim's commented text was over it."""
    for name, statement in statements.load().items():
        assert len(statement.query) <= _queries.MAX_CACHED_STATEMENT_LENGTH, name
        params = set(re.findall(rb"%\((\w+)\)s", statement.query))
        assert len(params) <= _queries.MAX_CACHED_STATEMENT_PARAMS, name


def test_comment_lines_and_indentation_are_left_in_the_file() -> None:
    text = """
-- name: one
-- What it does.
SELECT a,
       -- why b
       b
  FROM t;

-- name: two
-- Another.
SELECT 1
"""
    found = statements.parse(text)
    assert found["one"].description == "What it does."
    assert found["one"].query == b"SELECT a,\nb\nFROM t"
    assert found["two"].query == b"SELECT 1"


def shared_copies(text: str) -> dict[str, list[tuple[str, str]]]:
    """Per NAME, the (function, SQL) of every copy between "-- shared: NAME" and
    "-- end shared: NAME" in a file of function definitions, its SQL with comment lines,
    indentation and the function's own name as a qualifier of its parameters left out.
    Raises AssertionError on an unclosed copy."""
    copies: dict[str, list[tuple[str, str]]] = {}
    statement, open_copy, lines = "", "", []
    for raw in text.splitlines():
        line = raw.strip()
        if named := re.match(r"CREATE OR REPLACE FUNCTION leaseq\.(\w+)\(", line):
            assert not open_copy, f"{statement}: shared {open_copy} has no end"
            statement = named.group(1)
        elif start := re.fullmatch(r"-- shared: (\w+)", line):
            assert not open_copy, f"{statement}: shared {start.group(1)} inside {open_copy}"
            open_copy, lines = start.group(1), []
        elif end := re.fullmatch(r"-- end shared: (\w+)", line):
            assert end.group(1) == open_copy, f"{statement}: {line} does not end {open_copy!r}"
            copies.setdefault(open_copy, []).append((statement, "\n".join(lines)))
            open_copy = ""
        elif open_copy and line and not line.startswith("--"):
            lines.append(line.replace(f"{statement}.", ""))
    assert not open_copy, f"{statement}: shared {open_copy} has no end"
    return copies


def test_the_copies_of_a_shared_piece_are_the_same_sql() -> None:
    """The keyed claims are each written whole, and the pieces they share are copies (see
    definitions/claims.sql's head): every copy of a piece is the same SQL, and each is
    shared."""
    text = (resources.files("leaseq_sql") / "definitions" / "claims.sql").read_text(
        encoding="utf-8"
    )
    copies = shared_copies(text)
    assert set(copies) == {
        "keyed_slots",
        "keyed_ready",
        "keyed_taken",
        "keyed_claimed",
        "queues_rated",
    }
    for name, found in copies.items():
        assert len(found) >= 2, f"{name} is in {found[0][0]} only: nothing shares it"
        first_statement, first = found[0]
        for statement, sql in found[1:]:
            assert sql == first, f"{name} in {statement} differs from its copy in {first_statement}"


def test_a_copy_that_drifted_is_named() -> None:
    text = """
CREATE OR REPLACE FUNCTION leaseq.one(n integer)
    RETURN QUERY WITH
-- shared: tail
t AS (SELECT one.n + 1)
-- end shared: tail
SELECT * FROM t;

CREATE OR REPLACE FUNCTION leaseq.two(n integer)
    RETURN QUERY WITH
  -- shared: tail
  t AS (SELECT two.n + 2)
  -- end shared: tail
SELECT 2 FROM t
"""
    copies = shared_copies(text)
    assert copies == {"tail": [("one", "t AS (SELECT n + 1)"), ("two", "t AS (SELECT n + 2)")]}
    with pytest.raises(AssertionError, match="one: shared tail has no end"):
        shared_copies(text.replace("-- end shared: tail\nSELECT *", "SELECT *"))
