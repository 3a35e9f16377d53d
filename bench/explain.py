"""The plans of the statements inside leaseq's functions (the worker's door: its claims and
lease_* functions), which EXPLAIN of a call does not show: auto_explain logs them while the
call runs. Shared by the benchmarks and the tests that read those plans."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import psycopg

#: A statement that calls one of leaseq's door functions, and that function's name.
CALLS = re.compile(rb"leaseq\.(lease_\w+)\(")


def function_plans(
    conn: psycopg.Connection[Any], query: bytes, params: Mapping[str, Any], *, analyze: bool = False
) -> list[dict[str, Any]]:
    """The plans of the statements of the leaseq function that ``query`` calls
    (``leaseq.NAME(...)``: a claim or another door of the worker's), as auto_explain logs them
    while ``query`` runs once on ``conn`` under the session's settings (a worker's session
    plans generically: set ``plan_cache_mode`` first). Only the function's own statements,
    whose text names its parameters ``NAME.x``, not its triggers'. ``analyze``: with actual
    rows and buffers. Needs a superuser's connection (LOAD)."""
    match = CALLS.search(query)
    if match is None:
        raise ValueError(f"{query!r} calls no leaseq.lease_* function")
    own = match.group(1).decode() + "."
    logged: list[str] = []

    def keep(diagnostic: psycopg.errors.Diagnostic) -> None:
        logged.append(diagnostic.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        conn.execute("LOAD 'auto_explain'")
        on = "on" if analyze else "off"
        for setting in (
            "log_min_duration = 0",
            "log_nested_statements = on",
            "log_format = json",
            f"log_analyze = {on}",
            f"log_buffers = {on}",
        ):
            conn.execute(f"SET auto_explain.{setting}")
        conn.execute("SET client_min_messages = log")
        conn.execute(query, params)
        conn.execute("SET client_min_messages = notice")
    finally:
        conn.remove_notice_handler(keep)
    plans = [json.loads(m[m.index("{") :]) for m in logged if "plan:" in m]
    return [p["Plan"] for p in plans if own in p["Query Text"]]


def plan_lines(node: dict[str, Any], depth: int = 0) -> list[str]:
    """A JSON plan as indented text lines, one per node: its type, relation and index, and
    with ANALYZE its rows and shared buffers."""
    what = node["Node Type"]
    if "Relation Name" in node:
        what += f" on {node['Relation Name']}"
    if "Index Name" in node:
        what += f" using {node['Index Name']}"
    if "Actual Rows" in node:
        buffers = int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
        what += f" (rows={node['Actual Rows']}, buffers={buffers})"
    lines = ["  " * depth + what]
    for child in node.get("Plans", []):
        lines += plan_lines(child, depth + 1)
    return lines
