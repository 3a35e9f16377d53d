"""The capacity result (bench/results/capacity.csv, from :mod:`bench.capacity`) as the tables
of the report and of the docs' capacity page (scripts/docs_hooks.py renders them at build
time). Reads the CSV only, so the docs build needs nothing but this module and the results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.results import read
from bench.stats import percentile

NAME = "capacity"
#: The runtime's default heartbeat interval: what the paper's lease rows multiply by.
HEARTBEAT_SECONDS = 10.0

#: The sizing table's lines: (part, the setting's start, what the line says).
LINES: tuple[tuple[str, str, str], ...] = (
    ("idle", "", "the server, nothing connected (per second)"),
    ("enqueue", "enqueue_many", "enqueue, 1,000 jobs per call"),
    ("enqueue", "enqueue,", "enqueue, one job per call"),
    ("jobs", "", "claim + complete, a backlog drained"),
    ("keys", "", "keyed jobs, claim + complete"),
    ("leases", "", "a lease renewed (heartbeat_many)"),
    ("reaper", "", "a reaper pass with the leases held"),
    ("idle workers", "direct", "an idle `leaseq worker`, direct (per second)"),
    ("idle workers", "PgBouncer", "an idle `leaseq worker` behind PgBouncer (per second)"),
    ("pgbouncer jobs", "", "claim + complete, direct and through PgBouncer"),
    ("schedules", "every", "a schedule's slot fired"),
    ("schedules", "a tick", "a scheduler pass with nothing due"),
    ("history", "", "a finished job moved to history"),
)


def _rate(amount: float, cost_ms: float, spec: str = ",.0f") -> str:
    """``amount / cost_ms`` formatted, or a dash when the cost was too small to measure (a
    smoke-size run can see no CPU tick at all)."""
    return format(amount / cost_ms, spec) if cost_ms > 0 else "-"


def _cell(rows: Sequence[dict[str, str]], column: str) -> str:
    """Each round's value, in round order ("a / b"): the spread is the machine's noise."""
    values = [r.get(column, "") for r in rows]
    return " / ".join(v for v in values if v) or "-"


def _grouped(rows: Sequence[dict[str, str]]) -> list[tuple[str, list[dict[str, str]]]]:
    """Rows by line of LINES and then by (setting, size), in the order first measured."""
    out: list[tuple[str, list[dict[str, str]]]] = []
    for part, prefix, label in LINES:
        mine = [r for r in rows if r.get("part") == part and r["setting"].startswith(prefix)]
        if mine:
            out.append((label, mine))
    return out


def sizing_table(folder: Path) -> str:
    """The measured table: every part at every size, each round's value side by side."""
    rows = read(folder / f"{NAME}.csv")
    if not rows:
        return "_not run (`python -m bench --only capacity`)_\n"
    head = (
        "| what | setting | size | server CPU ms per unit | WAL bytes per unit | rate here "
        "(units/s) | server cores busy | connections |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for label, mine in _grouped(rows):
        configs = list(dict.fromkeys((r["setting"], r["size"]) for r in mine))
        for setting, size in configs:
            same = [r for r in mine if (r["setting"], r["size"]) == (setting, size)]
            extra = _cell(same, "pooler_cpu_ms_per_unit")
            pooled = f" (PgBouncer's own: {extra})" if extra != "-" else ""
            lines.append(
                f"| {label} | {setting} | {size} | {_cell(same, 'server_cpu_ms_per_unit')}"
                f"{pooled} | {_cell(same, 'wal_bytes_per_unit')} | {_cell(same, 'units_per_s')} "
                f"| {_cell(same, 'server_cores_busy')} | {_cell(same, 'server_connections')} |"
            )
    memory = [r for r in rows if r.get("part") == "connection memory"]
    if memory:
        lines.append(
            f"\nPrivate memory of an idle backend after one claim ({memory[0]['size']} "
            f"connections): {_cell(memory, 'private_mb_per_unit')} MB."
        )
    env = {r["key"]: r["value"] for r in read(folder / f"{NAME}_env.csv")}
    loads = " / ".join(dict.fromkeys(r.get("loadavg", "") for r in rows))
    lines.append(
        f"\nMeasured {env.get('run_at', '')} ({env.get('mode', '')} run), {env.get('cores')} "
        f"cores ({env.get('cpu_model')}), PostgreSQL {env.get('pg_version')}, "
        f"shared_buffers {env.get('pg.shared_buffers')}, synchronous_commit "
        f"{env.get('pg.synchronous_commit')}; load average at each round's start: {loads}. "
        f"Source: bench/results/{NAME}.csv."
    )
    return "\n".join(lines) + "\n"


def _median(rows: Sequence[dict[str, str]], column: str) -> float:
    values = [float(r[column]) for r in rows if r.get(column)]
    return percentile(values, 50)


def paper_table(folder: Path, cores: Sequence[int] = (2, 8, 32)) -> str:
    """ON PAPER: the measured CPU per unit (median of the rounds) times a rate a deployment
    runs at, as cores of a primary; and units per core if CPU alone bound it."""
    rows = read(folder / f"{NAME}.csv")
    if not rows:
        return "_not run_\n"

    def cost(part: str, prefix: str = "", size: str | None = None) -> float:
        mine = [
            r
            for r in rows
            if r.get("part") == part
            and r["setting"].startswith(prefix)
            and (size is None or r["size"] == size)
        ]
        return _median(mine, "server_cpu_ms_per_unit")

    best_w = max(
        (r for r in rows if r.get("part") == "jobs"), key=lambda r: float(r["units_per_s"])
    )
    job = cost("jobs", best_w["setting"]) + cost("enqueue", "enqueue_many")
    job_wal = sum(
        _median(
            [r for r in rows if r.get("part") == part and r["setting"].startswith(prefix)],
            "wal_bytes_per_unit",
        )
        for part, prefix in (("jobs", best_w["setting"]), ("enqueue", "enqueue_many"))
    )
    limited = [r for r in rows if r.get("part") == "keys" and "limit" in r["setting"]]
    top = max((r["size"] for r in limited), key=int, default="")
    keyed = _median([r for r in limited if r["size"] == top], "server_cpu_ms_per_unit")
    keyed += cost("enqueue", "enqueue_many")
    big = max(int(r["size"]) for r in rows if r.get("part") == "leases")
    renewal = cost("leases", size=str(big))
    worker = cost("idle workers", "direct")
    fire = cost("schedules", "every")
    moved = cost("history")
    whole = job + moved
    lines = [
        "| per server core, if CPU alone bound it | on paper |",
        "|---|---|",
        f"| jobs/s, enqueued 1,000 per call, claimed 16 per statement ({job:.3f} ms each) "
        f"| {_rate(1000, job)} |",
        f"| jobs/s, each also moved to history ({whole:.3f} ms each) | {_rate(1000, whole)} |",
        f"| jobs/s with a limit of 4 per key ({keyed:.3f} ms each) | {_rate(1000, keyed)} |",
        f"| running leases renewed every {HEARTBEAT_SECONDS:g} s ({renewal:.4f} ms per "
        f"renewal at {big:,} leases) | {_rate(HEARTBEAT_SECONDS * 1000, renewal)} |",
        f"| idle workers ({worker:.3f} ms per worker-second, polling every 1 s) "
        f"| {_rate(1000, worker)} |",
        f"| schedule slots fired per second ({fire:.3f} ms each) | {_rate(1000, fire)} |",
        f"| jobs moved to history per second ({moved:.3f} ms each) | {_rate(1000, moved)} |",
    ]
    lines += [
        "",
        "| primary cores (on paper, 70% busy) | " + " | ".join(str(c) for c in cores) + " |",
        "|---|" + "---|" * len(cores),
        "| jobs/s | " + " | ".join(_rate(0.7 * c * 1000, job) for c in cores) + " |",
        "| jobs/s, each also moved to history | "
        + " | ".join(_rate(0.7 * c * 1000, whole) for c in cores)
        + " |",
        f"| WAL at those jobs/s, MB/s ({job_wal:,.0f} bytes per job) | "
        + " | ".join(_rate(0.7 * c * 1000 * job_wal / 1e6, job, ",.1f") for c in cores)
        + " |",
        "| running leases | "
        + " | ".join(_rate(0.7 * c * HEARTBEAT_SECONDS * 1000, renewal) for c in cores)
        + " |",
    ]
    return "\n".join(lines) + "\n"
