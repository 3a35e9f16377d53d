"""Which metrics (and label values) the dashboard and the alert rules use, and which ones a
process exports.

Names are compared as *sample* names, the ones PromQL selects: a counter declared `x` is
exported as `x_total`, a histogram `h` as `h_bucket`, `h_sum` and `h_count`. Every leaseq
metric carries the `leaseq_` prefix (DESIGN.md), which is what lets a plain scan of PromQL
find them without a full parser: quoted strings (label values, legends) are removed first so
a `leaseq_...` inside a label value is never taken for a metric.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME = re.compile(r"(?<![\w:])leaseq_[A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"(?<![\w:])(leaseq_[A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_EQUALS = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def promql_names(expr: str) -> set[str]:
    """leaseq_* metric names selected by one PromQL expression."""
    return set(_NAME.findall(_STRING.sub('""', expr)))


def promql_matchers(expr: str) -> set[tuple[str, str, str]]:
    """(metric, label, value) of every `label="value"` matcher on a leaseq_* metric."""
    return {
        (metric, label, value)
        for metric, body in _SELECTOR.findall(expr)
        for label, value in _EQUALS.findall(body)
    }


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def dashboard_exprs(dashboard_json: str) -> list[str]:
    """Every PromQL text of a Grafana dashboard: panel targets and variable queries."""
    dashboard = json.loads(dashboard_json)
    exprs = [v for k, v in _walk(dashboard.get("panels", [])) if k == "expr" and isinstance(v, str)]
    for var in dashboard.get("templating", {}).get("list", []):
        q = var.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if var.get("type") == "query" and isinstance(q, str):
            exprs.append(q)
    return exprs


def grafana_rule_exprs(provisioning: str) -> list[str]:
    """The PromQL of Grafana-provisioned alert rules (a provisioning file's text)."""
    return [
        query["model"]["expr"]
        for group in yaml.safe_load(provisioning)["groups"]
        for rule in group["rules"]
        for query in rule["data"]
        if "expr" in query["model"]
    ]


@dataclass
class Exported:
    """One exported sample name: its metric, and every value seen of each of its labels."""

    metric: str
    labels: dict[str, set[str]] = field(default_factory=dict)


def exported_samples(exposition: str) -> dict[str, Exported]:
    """Every sample name in a /metrics text (what a running worker or operator exports).
    prometheus-client's `<metric>_created` timestamps are left out: bookkeeping of counters
    and histograms, not metrics of their own."""
    families = list(text_string_to_metric_families(exposition))
    timestamps = {f"{family.name}_created" for family in families}
    out: dict[str, Exported] = {}
    for family in families:
        if family.name in timestamps:
            continue
        for sample in family.samples:
            seen = out.setdefault(sample.name, Exported(family.name)).labels
            for label, value in sample.labels.items():
                seen.setdefault(label, set()).add(value)
    return out
