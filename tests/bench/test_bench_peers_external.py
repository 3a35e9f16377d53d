"""The peers that run in environments of their own (DBOS Transact, Chancy, Oban for Python):
how their limit scenario counts overlap, the skip path when one cannot be installed, that the
quick run leaves them out, and how the report shows them. No peer is installed here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import external, peers, report
from bench.context import Context
from bench.env import machine, server_info
from bench.external import PeerUnavailable, Stamp, max_overlap, max_overlap_per_worker
from bench.gang import GangRun
from bench.results import read


def test_overlap_counts_handlers_running_at_one_instant() -> None:
    stamps = [
        Stamp("w1", 0.0, 1.0),
        Stamp("w1", 0.5, 1.5),
        Stamp("w2", 0.9, 2.0),
        # Starts the instant another ends: back to back, not overlapping.
        Stamp("w2", 2.0, 3.0),
        Stamp("w1", 1.5, 2.5),
    ]
    assert max_overlap(stamps) == 3  # 0.9-1.0: two of w1 and one of w2
    assert max_overlap_per_worker(stamps) == 2
    assert max_overlap([Stamp("w1", 0.0, 1.0), Stamp("w1", 1.0, 2.0)]) == 1
    assert max_overlap([]) == 0


def test_a_limit_is_judged_at_its_documented_scope_and_across_the_fleet() -> None:
    chancy = next(s for s in external.SPECS if s.name == "chancy")
    dbos = next(s for s in external.SPECS if s.name == "dbos")
    # Two processes, each running two at once: 4 across the fleet.
    stamps = [Stamp(w, 0.0, 1.0) for w in ("w1", "w1", "w2", "w2")]
    gang = GangRun([{"started": 0.0, "cpu": 0.0}] * 2, 1.0, 0.0, 0.0, None)
    run = external.PeerRun(stamps, 4, gang)
    per_process = external.limits_row(run, chancy, jobs=4, workers=2, limit=2, job_seconds=1.0)
    assert (per_process["max_overlap"], per_process["max_overlap_per_process"]) == (4, 2)
    assert per_process["limit_held"] is True
    assert per_process["global_limit_held"] is False
    fleet = external.limits_row(run, dbos, jobs=4, workers=2, limit=2, job_seconds=1.0)
    assert fleet["limit_held"] is False


def test_no_fitting_interpreter_names_every_one_tried() -> None:
    oban = next(s for s in external.SPECS if s.name == "oban")
    impossible = external.Spec(**{**oban.__dict__, "min_python": (99, 0)})
    with pytest.raises(PeerUnavailable) as caught:
        external.pick_interpreter(impossible, [Path(sys.executable), Path("/nonexistent/py")])
    message = str(caught.value)
    assert "needs Python >= 99.0" in message
    assert f"{sys.executable} ({sys.version_info[0]}.{sys.version_info[1]})" in message
    assert "/nonexistent/py (does not run)" in message


def test_a_peer_that_cannot_be_installed_is_reported_and_the_run_goes_on(
    server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEASEQ_BENCH_PEERS_DIR", str(tmp_path / "venvs"))
    monkeypatch.setattr(external, "candidate_interpreters", lambda: [])
    ctx = Context(
        server_url, False, tmp_path, {**machine(), **server_info(server_url)}, peers=("oban",)
    )
    peers.run(ctx)

    (row,) = read(tmp_path / "peers.csv")
    assert (row["kind"], row["implementation"], row["version"]) == ("error", "oban", "0.7.0")
    assert "PeerUnavailable: oban 0.7.0 needs Python >= 3.12" in row["error"]
    assert not (tmp_path / "venvs" / "oban-0.7.0").exists()
    report.generate(tmp_path)
    assert "- oban 0.7.0: PeerUnavailable" in (tmp_path / "REPORT.md").read_text()


def test_the_quick_run_leaves_the_external_peers_out() -> None:
    assert "external" not in peers.plan_for(quick=True)
    full = peers.plan_for(quick=False)["external"]["settings"]
    assert set(full) == {spec.name for spec in external.SPECS}
    assert all({s for s, _ in settings} == {"default", "tuned"} for settings in full.values())


def test_the_report_shows_each_runtime_at_default_and_best_and_the_limits() -> None:
    def row(impl: str, batch: int, rate: float, setting: str = "") -> dict[str, str]:
        return {"kind": "noop", "loop": "runtime", "implementation": impl, "workers": "4",
                "batch": str(batch), "jobs_per_second": str(rate), "loadavg": "1.0",
                "setting": setting, "version": "1", "round": "1",
                "client_cpu_ms_per_job": "0.1", "server_cpu_ms_per_job": "0.1"}  # fmt: skip

    def limit(impl: str, scope: str, overlap: int, per: int, held: bool) -> dict[str, str]:
        return {"kind": "limits", "implementation": impl, "limit": "4", "workers": "4",
                "limit_scope": scope, "max_overlap": str(overlap), "round": "1",
                "max_overlap_per_process": str(per), "limit_held": str(held)}  # fmt: skip

    rows = [
        row("leaseq worker", 1, 600.0),
        row("leaseq worker", 64, 6000.0),
        row("dbos", 0, 300.0, "default"),
        row("dbos", 1000, 500.0, "tuned"),
        row("oban", 10, 1200.0, "default"),
        limit("dbos", "global", 4, 4, True),
        limit("oban", "per process", 16, 4, True),
        limit("chancy", "per process", 16, 5, False),
    ]
    lines = {name: value for name, _, value in report._runtime_lines(rows)}
    assert lines["no-op throughput at defaults, W=4"] == (
        "leaseq worker (concurrency 1) 600.0; dbos (default (limit none)) 300.0 (2.00x); "
        "oban (default (limit 10)) 1200.0 (0.50x); load 1.0"
    )
    assert lines["concurrency limit 4 over W=4 processes, most handlers running at once"] == (
        "dbos (global limit) 4, 4 in one process: held; "
        "oban (per process limit) 16, 4 in one process: held; "
        "chancy (per process limit) 16, 5 in one process: **not held**"
    )
    summary = report._peer_summary(rows)
    assert "| 1 | dbos 1 | default | W=4, default (limit none) | 300.0 | 2.00x |" in summary
    assert "| 1 | dbos 1 | best | W=4, tuned (limit 1000) | 500.0 | 12.00x |" in summary
