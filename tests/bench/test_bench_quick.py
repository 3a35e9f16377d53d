"""Smoke test of the benchmark harness: one tiny configuration, CSV, then the report.

It checks that the pieces run end to end, never how fast anything is (CI runs
``python -m bench --quick`` for the full quick suite).
"""

from __future__ import annotations

from pathlib import Path

from bench import batching, claim_scaling, lease_renewal, report, result_latency, start, wakes
from bench.__main__ import main
from bench.context import Context
from bench.env import machine, scratch_database, server_info
from bench.results import read


def test_tiny_claim_run_writes_csv_and_report(server_url: str, tmp_path: Path) -> None:
    ctx = Context(server_url, True, tmp_path, {**machine(), **server_info(server_url)})
    with scratch_database(server_url, "smoke") as url:
        rows = [
            claim_scaling.measure(url, s, workers=2, jobs=6, job_seconds=0.01)
            for s in ("naive", "leaseq")
        ]
    recorder = ctx.recorder(claim_scaling.NAME)
    recorder.params({"jobs": 6})
    recorder.table(claim_scaling.NAME, rows)

    written = read(tmp_path / "claim_scaling.csv")
    assert [r["strategy"] for r in written] == ["naive", "leaseq"]
    leaseq_row = written[1]
    assert leaseq_row["executions"] == "6"
    assert leaseq_row["duplicates"] == "0"
    assert leaseq_row["pg_version"]

    assert main(["report", "--results", str(tmp_path)]) == 0
    text = (tmp_path / "REPORT.md").read_text()
    assert "Claim correctness and scaling" in text
    assert (tmp_path / "claim_efficiency.png").stat().st_size > 0
    assert report.generate(tmp_path) == tmp_path / "REPORT.md"


def test_batching_from_a_backlog_reports_full_batches(server_url: str, tmp_path: Path) -> None:
    ctx = Context(server_url, True, tmp_path, {**machine(), **server_info(server_url)})
    with scratch_database(server_url, "smoke_batching") as url:
        rows = [batching.measure(url, "embed8", 8, 16, "thread")]
    ctx.recorder(batching.NAME).table(batching.NAME, rows)

    (written,) = read(tmp_path / "batching.csv")
    # 16 jobs from a backlog are two model calls of 8 (not 8 + 8 x 1).
    assert (written["model_calls"], written["jobs_per_call"]) == ("2", "8.0")
    assert main(["report", "--results", str(tmp_path)]) == 0
    assert "Micro-batching from a backlog" in (tmp_path / "REPORT.md").read_text()


def test_tiny_result_latency_run_reports_both_faces(server_url: str, tmp_path: Path) -> None:
    ctx = Context(server_url, True, tmp_path, {**machine(), **server_info(server_url)})
    with scratch_database(server_url, "smoke") as url:
        rows = result_latency.measure(url, jobs=3)
    assert [(r["face"], r["jobs"]) for r in rows] == [("sync", 3), ("async", 3)]
    ctx.recorder(result_latency.NAME).table(result_latency.NAME, rows)
    assert "8. Enqueue to result()" in report.generate(tmp_path).read_text()


def test_tiny_start_run_times_every_job_from_enqueue_to_handler(
    server_url: str, tmp_path: Path
) -> None:
    ctx = Context(server_url, True, tmp_path, {**machine(), **server_info(server_url)})
    with scratch_database(server_url, "smoke_start") as url:
        row = start.measure("leaseq worker", url, start.Plan(1, 3, 0.05, 0.01))
    # Every counted job's handler started and was timed; the warm-up jobs are not counted.
    assert (row["jobs"], row["started"]) == (3, 3)
    assert 0 < row["start_p50_ms"] <= row["start_p99_ms"] <= row["start_max_ms"]
    ctx.recorder(start.NAME).table(start.NAME, [{"round": 1, **row}])
    text = report.generate(tmp_path).read_text()
    assert "6b. Slow jobs into idle workers" in text
    assert f"enqueue to handler start, p50 / p99 | p99 <= 10 ms | {row['start_p50_ms']} / " in text


def test_tiny_wakes_run_times_every_sleep_and_signal(server_url: str, tmp_path: Path) -> None:
    ctx = Context(server_url, True, tmp_path, {**machine(), **server_info(server_url)})
    plan = wakes.Plan(
        sparse=1, sleepers=2, seconds=0.2, gap=0.05, signals=2, pause=0.05, idle_seconds=1.0,
        far_sleepers=1,
    )  # fmt: skip
    with scratch_database(server_url, "smoke_wakes") as url:
        found = wakes.measure(url, plan, tmp_path)
    counts = {measure: len(values) for measure, values in found.items()}
    assert counts == {"sleep_late_sparse": 1, "sleep_late_busy": 2, "signal_trip": 2}
    ctx.recorder(wakes.NAME).table(wakes.NAME, wakes.table_rows("leaseq worker", found, 0.0))
    ctx.recorder(wakes.NAME).params({"load": plan.load()})
    text = report.generate(tmp_path).read_text()
    assert "13. Durable sleep and signal" in text and "| leaseq worker | signal_trip | 2 |" in text


def test_tiny_lease_renewal_run_reports_every_arm(server_url: str, tmp_path: Path) -> None:
    ctx = Context(server_url, True, tmp_path, {**machine(), **server_info(server_url)})
    with scratch_database(server_url, "smoke") as url:
        rows, duties = lease_renewal.measure(url, [16], renewals=16)
    assert [(r["statistics"], r["arm"], r["statements_per_round"]) for r in rows] == [
        ("stale", "per_lease", 16),
        ("stale", "per_worker", 2),
        ("fresh", "per_lease", 16),
        ("fresh", "per_worker", 2),
    ]
    assert [(r["leases"], r["statistics"], r["duty"]) for r in duties] == [
        (16, "stale", "reap"),
        (16, "stale", "work"),
        (16, "fresh", "reap"),
        (16, "fresh", "work"),
    ]
    ctx.recorder(lease_renewal.NAME).table(lease_renewal.NAME, rows)
    ctx.recorder(lease_renewal.NAME).table(f"{lease_renewal.NAME}_passes", duties)
    text = report.generate(tmp_path).read_text()
    assert "10. Keeping leases alive" in text
    assert "| 16 | fresh | reap |" in text


def test_the_report_compares_each_runtime_at_its_default_with_the_others_at_theirs() -> None:
    def row(impl: str, batch: int, rate: float) -> dict[str, str]:
        return {"kind": "noop", "loop": "runtime", "implementation": impl, "workers": "4",
                "batch": str(batch), "jobs_per_second": str(rate), "loadavg": "1.0",
                "client_cpu_ms_per_job": "0.1", "server_cpu_ms_per_job": "0.1"}  # fmt: skip

    rows = [
        row("leaseq worker", 1, 600.0),
        row("leaseq worker", 16, 4000.0),
        row("pgqueuer", 10, 1200.0),
        row("pgqueuer", 64, 9000.0),
        row("procrastinate", 1, 300.0),
    ]
    lines = {name: value for name, _, value in report._runtime_lines(rows)}
    assert lines["no-op throughput at defaults, W=4"] == (
        "leaseq worker (concurrency 1) 600.0; pgqueuer (batch 10) 1200.0 (0.50x); "
        "procrastinate (batch 1) 300.0 (2.00x); load 1.0"
    )
    best = lines["no-op throughput, `leaseq worker` vs the fastest peer runtime"]
    assert best.startswith("0.44x: 4000.0 jobs/s (W=4, concurrency 16) vs pgqueuer 9000.0")
