"""The named statements as loaded: what psycopg is sent, and what it can cache."""

from __future__ import annotations

import re

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


def test_a_part_is_shared_by_the_statements_that_include_it() -> None:
    text = """
-- part: tail
-- The shared end.
t AS (SELECT 1)
-- name: one
-- First.
WITH
-- include: tail
SELECT * FROM t;

-- name: two
-- Second.
WITH
  -- include: tail
SELECT 2 FROM t
"""
    found = statements.parse(text)
    assert set(found) == {"one", "two"}
    assert found["one"].query == b"WITH\nt AS (SELECT 1)\nSELECT * FROM t"
    assert found["two"].query == b"WITH\nt AS (SELECT 1)\nSELECT 2 FROM t"


def test_an_include_of_a_missing_part_is_an_error_that_names_it() -> None:
    text = "-- name: one\n-- First.\nWITH\n-- include: nowhere\nSELECT 1\n"
    with pytest.raises(ValueError, match="one includes nowhere"):
        statements.parse(text)
