"""Reading the plans of named statements as a worker's session would run them."""

from __future__ import annotations

import re
from typing import Any


def generic(query: bytes) -> tuple[str, list[str]]:
    """``query`` with its comments dropped and its %(name)s placeholders as $1, $2... in order
    of first appearance, and those names in that order.

    Comments go first: a placeholder named in a comment would number a parameter the server
    never sees, and then cannot type.
    """
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"--.*", "", query.decode())
    return re.sub(r"%\((\w+)\)s", number, text), names


def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every scan node of a JSON plan tree, depth first."""
    found = [node] if "Scan" in node["Node Type"] else []
    for child in node.get("Plans", []):
        found.extend(scans(child))
    return found


def writes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an analyzed JSON plan tree that wrote rows (a ModifyTable with rows
    out), depth first."""
    found = [node] if node["Node Type"] == "ModifyTable" and node["Actual Rows"] else []
    for child in node.get("Plans", []):
        found.extend(writes(child))
    return found
