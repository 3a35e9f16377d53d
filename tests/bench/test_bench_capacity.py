"""Smoke test of the capacity scenario (bench/capacity.py) at its quick size: every part of
the workload measured once, each unit counted from what the database did, the CSV written,
and the docs' tables rendered from it. It never checks how fast anything is."""

from __future__ import annotations

from pathlib import Path

from bench import capacity, capacity_tables, report
from bench.context import Context
from bench.env import machine, scratch_database, server_info
from bench.results import read


def test_every_part_is_measured_and_rendered(server_url: str, tmp_path: Path) -> None:
    sizes = capacity.QUICK
    ctx = Context(server_url, True, tmp_path, {**machine(), **server_info(server_url)})
    with scratch_database(server_url, "smoke_capacity") as url:
        rows = capacity.measure(url, sizes, ctx.log)
    by_part: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        by_part.setdefault(str(r["part"]), []).append(r)

    # Units are what the database did, not what was asked for.
    assert [r["units"] for r in by_part["jobs"]] == [sizes.jobs]
    (keys, limit), *_ = sizes.keys
    (keyed,) = by_part["keys"]
    assert keyed["units"] == max(sizes.jobs, keys)
    assert keyed["setting"] == f"W={sizes.workers[0]}, limit {limit} per key"
    assert int(str(keyed["table_bytes_per_unit"])) > 0
    (moved,) = by_part["history"]
    assert moved["units"] == sizes.history
    fired, idle = by_part["schedules"]
    assert (fired["units"], idle["units"]) == (sizes.schedules[0], capacity.IDLE_TICKS)
    assert [r["size"] for r in by_part["leases"]] == list(sizes.leases)
    assert [r["size"] for r in by_part["reaper"]] == list(sizes.leases)

    # Every metered part wrote WAL (a job, a renewal, a fired slot, a move all write).
    for part in ("enqueue", "jobs", "keys", "leases", "history"):
        assert all(int(str(r["wal_bytes_per_unit"])) > 0 for r in by_part[part]), part
    # A real worker holds connections of its own; behind PgBouncer the server sees at most
    # the pool.
    (direct,) = [r for r in by_part["idle workers"] if r["setting"].startswith("direct")]
    assert int(str(direct["server_connections"])) >= 1
    if by_part["pgbouncer jobs"][0]["setting"].startswith("skipped"):
        return
    pooled = [r for r in by_part["idle workers"] if r["setting"].startswith("PgBouncer")]
    assert all(1 <= int(str(r["server_connections"])) <= capacity.POOL for r in pooled)
    through = [r for r in by_part["pgbouncer jobs"] if "PgBouncer" in str(r["setting"])]
    assert [r["units"] for r in through] == [sizes.jobs]

    recorder = ctx.recorder(capacity.NAME)
    recorder.params(vars(sizes))
    recorder.table(capacity.NAME, [{"round": 1, "loadavg": "0", **r} for r in rows])
    assert len(read(tmp_path / "capacity.csv")) == len(rows)
    sizing = capacity_tables.sizing_table(tmp_path)
    assert f"| claim + complete, a backlog drained | W={sizes.workers[0]}, claim 16 |" in sizing
    assert "Source: bench/results/capacity.csv." in sizing
    paper = capacity_tables.paper_table(tmp_path)
    assert "| jobs/s with a limit of 4 per key" in paper
    assert "nan" not in paper
    assert "12. Capacity of one primary" in report.generate(tmp_path).read_text()
