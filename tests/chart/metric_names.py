"""Which metric names the dashboard and the alert rules use, and which ones a process exports.

Names are compared as *sample* names, the ones PromQL selects: a counter declared `x` is
exported as `x_total`, a histogram `h` as `h_bucket`, `h_sum` and `h_count`. Every leaseq
metric carries the `leaseq_` prefix (DESIGN.md), which is what lets a plain scan of PromQL
find them without a full parser: quoted strings (label values, legends) are removed first so
a `leaseq_...` inside a label value is never taken for a metric.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME = re.compile(r"(?<![\w:])leaseq_[A-Za-z0-9_:]*")


def promql_names(expr: str) -> set[str]:
    """leaseq_* metric names selected by one PromQL expression."""
    return set(_NAME.findall(_STRING.sub('""', expr)))


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL text of a Grafana dashboard: panel targets and variable queries."""
    exprs = [v for k, v in _walk(dashboard.get("panels", [])) if k == "expr" and isinstance(v, str)]
    for var in dashboard.get("templating", {}).get("list", []):
        q = var.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if var.get("type") == "query" and isinstance(q, str):
            exprs.append(q)
    return exprs


def dashboard_names(dashboard_json: str) -> set[str]:
    """leaseq_* names the dashboard queries."""
    return _union(promql_names(e) for e in dashboard_exprs(json.loads(dashboard_json)))


def rule_names(rules: Iterable[dict[str, Any]]) -> set[str]:
    """leaseq_* names used by Prometheus rules (dicts with an `expr`)."""
    return _union(promql_names(r["expr"]) for r in rules)


def exported_names(exposition: str) -> set[str]:
    """Sample names in a /metrics text (what a running worker or operator exports)."""
    return {
        sample.name
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def _union(sets: Iterable[set[str]]) -> set[str]:
    out: set[str] = set()
    for s in sets:
        out |= s
    return out
