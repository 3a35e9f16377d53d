"""A tiny run of the pipelines benchmark: it measures, writes CSV, and the report shows it."""

from __future__ import annotations

from pathlib import Path

from bench import pipelines, report
from bench.context import Context
from bench.env import machine, scratch_database, server_info


def test_tiny_pipelines_run_reports_every_table(server_url: str, tmp_path: Path) -> None:
    ctx = Context(server_url, True, tmp_path, {**machine(), **server_info(server_url)})
    with scratch_database(server_url, "smoke") as url:
        tables = pipelines.measure(url, width=30, samples=3)
    rates = {r["case"]: r for r in tables["pipelines_completion_rate"]}
    assert rates["fan_in_parents_of_one"]["children_ready"] == 1
    assert rates["chains_parent_of_own_child"]["children_ready"] == 30
    assert [r["case"] for r in tables["pipelines_fan_out"]] == [
        "enqueue_graph",
        "cancel_pipeline",
        "spawn_in_completion",
    ]
    cancelled = {r["case"]: r for r in tables["pipelines_fan_out"]}["cancel_pipeline"]
    assert cancelled["jobs"] == 31  # the graph's 30 pages and its merge
    assert tables["pipelines_unblock"][0]["samples"] == 3
    recorder = ctx.recorder(pipelines.NAME)
    for name, rows in tables.items():
        recorder.table(name, rows)
    assert "9. Pipelines" in report.generate(tmp_path).read_text()
