"""``python -m bench report``: REPORT.md and PNG plots, generated from the CSV files only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench import capacity_tables
from bench.peers import DEFAULTS
from bench.results import read

Rows = list[dict[str, str]]


def _f(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else float("nan")
    except ValueError:
        return float("nan")


def _table(rows: Rows, columns: Sequence[str], headers: Sequence[str] | None = None) -> str:
    if not rows:
        return "_no rows_\n"
    head = headers or columns
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.get(c, "") for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _plot(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, tuple[list[float], list[float]]],
    *,
    logy: bool = False,
) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"![{title}]({path.name})\n"


def _environment(folder: Path) -> str:
    envs = {
        e.name.removesuffix("_env.csv"): {r["key"]: r["value"] for r in read(e)}
        for e in sorted(folder.glob("*_env.csv"))
    }
    if not envs:
        return "_no environment recorded_\n"

    def machine(kv: dict[str, str]) -> str:
        pg = ", ".join(f"{k[3:]}={v}" for k, v in kv.items() if k.startswith("pg."))
        return (
            f"{kv.get('cores')} cores, {kv.get('cpu_model')}, {kv.get('os')}, Python "
            f"{kv.get('python')}; PostgreSQL {kv.get('pg_version')} ({pg})"
        )

    machines = {machine(kv) for kv in envs.values()}
    out = [f"Machine and server: {machines.pop()}\n"] if len(machines) == 1 else []
    for scenario, kv in envs.items():
        params = ", ".join(f"{k[6:]}={v}" for k, v in kv.items() if k.startswith("param."))
        where = "" if not machines else f"{machine(kv)}; "
        out.append(
            f"- **{scenario}** ({kv.get('mode')}, {kv.get('run_at')}, load average "
            f"{kv.get('loadavg_at_start', 'not recorded')} at start): {where}{params}"
        )
    return "\n".join(out) + "\n"


def _by(rows: Rows, **match: str) -> Rows:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def _headline(folder: Path) -> str:
    claim = read(folder / "claim_scaling.csv")
    explain = read(folder / "history_explain.csv")
    churn = read(folder / "history_churn.csv")
    noop = read(folder / "throughput.csv")
    peers = read(folder / "peers.csv")
    lines: list[tuple[str, str, str]] = []
    leaseq_claims = _by(claim, strategy="leaseq")
    if leaseq_claims:
        dup = sum(int(r["duplicates"]) for r in leaseq_claims)
        wrong = sum(int(r["wrong_attempt_counts"]) for r in leaseq_claims)
        naive = max(_by(claim, strategy="naive"), key=lambda r: int(r["workers"]), default=None)
        lines.append(
            (
                "duplicates / wrong attempt counts, every W",
                "0 / 0",
                f"{dup} / {wrong} (naive at W={naive['workers']}: {naive['executions']} "
                f"executions for {naive['jobs']} jobs)"
                if naive
                else f"{dup} / {wrong}",
            )
        )
        top = max(leaseq_claims, key=lambda r: int(r["workers"]))
        lines.append(
            (
                f"efficiency vs linear at W={top['workers']} (API loop, scenario 1)",
                ">= 98%",
                f"{_f(top['efficiency']):.1%}",
            )
        )
        lines.append(
            (
                f"claim p50 at W={top['workers']} (API loop, scenario 1)",
                "<= 1.5 ms",
                f"{top['claim_p50_ms']} ms (p99 {top['claim_p99_ms']} ms)",
            )
        )
    claims = _by(explain, statement="job_claim", partial_index="True")
    if len(claims) >= 2:
        fresh, old = claims[0], claims[-1]
        lines.append(
            (
                f"claim with {old['finished_rows']} finished rows vs 0",
                "unchanged",
                f"{old['buffers']} vs {fresh['buffers']} buffers, {old['execution_ms']} vs "
                f"{fresh['execution_ms']} ms",
            )
        )
    for arm in churn:
        lines.append(
            (
                f"claim after {arm['jobs']} churned jobs vs fresh, arm `{arm['arm']}`",
                "(control)" if arm["arm"] == "control" else "<= 2x",
                f"{arm['after_claim_buffers']} vs {arm['fresh_claim_buffers']} buffers, "
                f"{arm['after_claim_ms']} vs {arm['fresh_claim_ms']} ms (worst during: "
                f"{arm['worst_claim_buffers']} buffers, {arm['worst_claim_ms']} ms)",
            )
        )
    lines += _runtime_lines(peers)
    lines += _start_lines(read(folder / "start.csv"))
    for r in _by(noop, kind="wakeup", wake_mode="notify"):
        lines.append(
            (
                "wake-up latency with LISTEN/NOTIFY, p50 / p99",
                "< 20 ms",
                f"{r['wakeup_p50_ms']} / {r['wakeup_p99_ms']} ms",
            )
        )
    if not lines:
        return "_no results yet_\n"
    body = ["| measure | goal (issues 6, 13) | measured |", "|---|---|---|"]
    body += [f"| {a} | {b} | {c} |" for a, b, c in lines]
    return "\n".join(body) + "\n"


def _label(row: dict[str, str]) -> str:
    name = row["implementation"]
    return f"{name} (API loop)" if row.get("loop") == "api" else name


def _config(row: dict[str, str]) -> str:
    if row.get("setting"):  # a peer in its own environment: its setting, then its limit
        limit = row["batch"] if row["batch"] not in ("", "0") else "none"
        return f"W={row['workers']}, {row['setting']} (limit {limit})"
    knob = "concurrency" if row["implementation"] == "leaseq worker" else "batch"
    return f"W={row['workers']}, {knob} {row['batch']}"


def _is_default(row: dict[str, str]) -> bool:
    """Whether a no-op row is its runtime at its default setting (``bench.peers.DEFAULTS``)."""
    if row.get("setting"):
        return row["setting"] == "default"
    return DEFAULTS.get(row["implementation"]) == int(_f(row["batch"]))


def _runtime_lines(peers: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    """Headline rows from the peers scenario, one set per round: the runtime against the
    fastest peer runtime (best configuration of each), its CPU per job, the API loops
    (labelled), and the sleep workload through real workers."""
    lines: list[tuple[str, str, str]] = []
    for tag, rows in _rounds(peers):
        best = _best(_by(rows, kind="noop"))
        peer_rows = [r for k, r in best.items() if not k.startswith("leaseq")]
        if not peer_rows:
            continue
        peer = max(peer_rows, key=lambda r: _f(r["jobs_per_second"]))
        for name, mine in sorted(best.items(), key=lambda kv: kv[0] != "leaseq worker"):
            if not name.startswith("leaseq"):
                continue
            runtime = name == "leaseq worker"
            lines.append(
                (
                    # Only the runtime is a command; an API loop is named in plain text.
                    f"no-op throughput, {f'`{name}`' if runtime else name} vs the fastest peer "
                    f"runtime{tag}",
                    ">= 1.0x, best against best" if runtime else "(API loop, not a runtime)",
                    _versus(mine, peer),
                )
            )
            if runtime:
                lines.append(
                    (
                        f"client / server CPU per job, `leaseq worker` at its best{tag}",
                        "<= 0.08 ms, client + server",
                        f"{mine['client_cpu_ms_per_job']} / {mine['server_cpu_ms_per_job']} ms "
                        f"({peer['implementation']}: {peer['client_cpu_ms_per_job']} / "
                        f"{peer['server_cpu_ms_per_job']} ms)",
                    )
                )
        alone = _best(_by(rows, kind="noop", workers="1"))
        peer_alone = [r for k, r in alone.items() if not k.startswith("leaseq")]
        if "leaseq worker" in alone and peer_alone:
            other = max(peer_alone, key=lambda r: _f(r["jobs_per_second"]))
            lines.append(
                (
                    f"no-op throughput at W=1, `leaseq worker` vs the fastest peer runtime{tag}",
                    ">= 1.0x, best against best",
                    _versus(alone["leaseq worker"], other),
                )
            )
        lines += _default_lines(rows, tag)
        lines += _limit_lines(rows, tag)
        others = "; ".join(
            f"{p['implementation']}'s loop {p['efficiency']} / {p['claim_p50_ms']} ms"
            for p in _by(rows, kind="sleep")
            if p["implementation"] != "leaseq worker"
        )
        for r in _by(rows, kind="sleep", implementation="leaseq worker"):
            lines.append(
                (
                    f"sleep jobs {r['jobs']} x {_f(r['job_seconds']) * 1000:.0f} ms at "
                    f"W={r['workers']}, `leaseq worker`: efficiency / claim p50{tag}",
                    ">= 0.95 / <= 1.5 ms",
                    f"{r['efficiency']} / {r['claim_p50_ms']} ms (p99 {r['claim_p99_ms']} ms, "
                    f"{r['duplicates']} duplicates; {others}); load {r.get('loadavg', '')}",
                )
            )
    return lines


def _peer_summary(rows: Rows) -> str:
    """Per round, each runtime at its default and at its best setting (the best over every
    worker count): jobs/s, and `leaseq worker` at the same class of setting over this
    (above 1: leaseq ahead)."""
    table = []
    for _, these in _rounds(rows):
        runtimes = [r for r in _by(these, kind="noop") if r.get("loop") == "runtime"]
        classes = {
            "default": [r for r in runtimes if _is_default(r)],
            "best": runtimes,
        }
        for setting, candidates in classes.items():
            best = _best(candidates)
            mine = best.get("leaseq worker")
            for name, r in sorted(best.items(), key=lambda kv: kv[0] != "leaseq worker"):
                ratio = _f(mine["jobs_per_second"]) / _f(r["jobs_per_second"]) if mine else None
                table.append(
                    {
                        "round": r.get("round") or "1",
                        "runtime": f"{name} {r.get('version', '')}",
                        "setting": setting,
                        "config": _config(r),
                        "jobs_per_second": r["jobs_per_second"],
                        "leaseq_ratio": "" if ratio is None or r is mine else f"{ratio:.2f}x",
                        "cpu": f"{r['client_cpu_ms_per_job']} / {r['server_cpu_ms_per_job']}",
                        "loadavg": r.get("loadavg", ""),
                    }
                )
    return _table(
        table,
        ["round", "runtime", "setting", "config", "jobs_per_second", "leaseq_ratio", "cpu",
         "loadavg"],
        ["round", "runtime", "setting", "best configuration", "jobs/s",
         "`leaseq worker` / this", "client / server CPU ms per job", "load"],
    )  # fmt: skip


def _limit_lines(rows: Rows, tag: str) -> list[tuple[str, str, str]]:
    """One headline row per round: each peer's concurrency limit against the most handlers
    seen running at one instant (from the handlers' own timestamps)."""
    limits = _by(rows, kind="limits")
    if not limits:
        return []
    first = limits[0]
    return [
        (
            f"concurrency limit {first['limit']} over W={first['workers']} processes, "
            f"most handlers running at once{tag}",
            "(reported)",
            "; ".join(
                f"{r['implementation']} ({r['limit_scope']} limit) {r['max_overlap']}, "
                f"{r['max_overlap_per_process']} in one process: "
                + ("held" if r["limit_held"] == "True" else "**not held**")
                for r in limits
            ),
        )
    ]


def _rounds(rows: Rows) -> list[tuple[str, Rows]]:
    """The rows of each round in order, with the tag a headline line gets (", run N" when
    there is more than one round)."""
    rounds = sorted({r.get("round") or "1" for r in rows}, key=int)
    return [
        (f", run {n}" if len(rounds) > 1 else "", [r for r in rows if (r.get("round") or "1") == n])
        for n in rounds
    ]


def _versus(mine: dict[str, str], peer: dict[str, str]) -> str:
    """``mine`` against ``peer``: the ratio of their jobs/s, each one's configuration, and
    the load when the peer's run started."""
    return (
        f"{_f(mine['jobs_per_second']) / _f(peer['jobs_per_second']):.2f}x: "
        f"{mine['jobs_per_second']} jobs/s ({_config(mine)}) vs "
        f"{peer['implementation']} {peer['jobs_per_second']} ({_config(peer)}); "
        f"load {peer.get('loadavg', '')}"
    )


def _best(rows: Rows) -> dict[str, dict[str, str]]:
    """Each implementation's (and loop's) fastest row."""
    best: dict[str, dict[str, str]] = {}
    for r in rows:
        key = _label(r)
        if key not in best or _f(r["jobs_per_second"]) > _f(best[key]["jobs_per_second"]):
            best[key] = r
    return best


def _start_lines(rows: Rows) -> list[tuple[str, str, str]]:
    """Headline rows from the start scenario, one per round: idle ``leaseq worker``
    processes' enqueue-to-handler-start latency, beside each peer runtime's."""
    lines: list[tuple[str, str, str]] = []
    for tag, round_rows in _rounds(rows):
        these = [r for r in round_rows if not r.get("error")]
        others = "; ".join(
            f"{r['implementation']} {r['start_p50_ms']} / {r['start_p99_ms']} ms"
            for r in these
            if r["implementation"] != "leaseq worker"
        )
        for r in _by(these, implementation="leaseq worker"):
            lines.append(
                (
                    f"slow job into idle `leaseq worker` processes (W={r['workers']}), enqueue "
                    f"to handler start, p50 / p99{tag}",
                    "p99 <= 10 ms",
                    f"{r['start_p50_ms']} / {r['start_p99_ms']} ms ({others}); "
                    f"load {r.get('loadavg', '')}",
                )
            )
    return lines


def _default_lines(rows: list[dict[str, str]], tag: str) -> list[tuple[str, str, str]]:
    """Per worker count, each runtime at its default setting (``bench.peers.DEFAULTS``):
    what a user gets before tuning anything."""
    noop = _by(rows, kind="noop")
    at_default = [r for r in noop if r.get("loop") == "runtime" and _is_default(r)]
    lines = []
    for workers in sorted({r["workers"] for r in at_default}, key=int):
        here = [r for r in at_default if r["workers"] == workers]
        mine = [r for r in here if r["implementation"] == "leaseq worker"]
        if not mine or len(here) < 2:
            continue
        rate = _f(mine[0]["jobs_per_second"])
        lines.append(
            (
                f"no-op throughput at defaults, W={workers}{tag}",
                "(reported)",
                "; ".join(
                    f"{r['implementation']} ({_config(r).split(', ', 1)[1]}) {r['jobs_per_second']}"
                    + ("" if r is mine[0] else f" ({rate / _f(r['jobs_per_second']):.2f}x)")
                    for r in [mine[0], *(r for r in here if r is not mine[0])]
                )
                + f"; load {mine[0].get('loadavg', '')}",
            )
        )
    return lines


def _claim_scaling(folder: Path) -> str:
    rows = read(folder / "claim_scaling.csv")
    if not rows:
        return "_not run_\n"
    out = _table(
        rows,
        [
            "strategy",
            "workers",
            "jobs",
            "executions",
            "duplicates",
            "max_copies_of_one_job",
            "max_copies_window_ms",
            "wrong_attempt_counts",
            "seconds",
            "ideal_seconds",
            "jobs_per_second",
            "efficiency",
            "claim_p50_ms",
            "claim_p99_ms",
            "client_cpu_ms_per_job",
            "server_cpu_ms_per_job",
        ],
    )
    series = {
        s: (
            [_f(r["workers"]) for r in _by(rows, strategy=s)],
            [_f(r["efficiency"]) for r in _by(rows, strategy=s)],
        )
        for s in ("naive", "leaseq")
    }
    out += "\n" + _plot(
        folder / "claim_efficiency.png",
        "Efficiency vs ideal N*d/W",
        "workers",
        "efficiency",
        series,
    )
    series = {
        s: (
            [_f(r["workers"]) for r in _by(rows, strategy=s)],
            [_f(r["executions"]) for r in _by(rows, strategy=s)],
        )
        for s in ("naive", "leaseq")
    }
    out += _plot(
        folder / "claim_executions.png",
        "Executions for the same jobs",
        "workers",
        "executions",
        series,
    )
    return out


def _txn_scope(folder: Path) -> str:
    rows = read(folder / "txn_scope.csv")
    if not rows:
        return "_not run_\n"
    out = _table(
        rows,
        [
            "scope",
            "workers",
            "job_seconds",
            "jobs",
            "jobs_per_second",
            "claim_p50_ms",
            "max_idle_in_transaction",
            "mean_idle_in_transaction",
            "max_transaction_age_s",
            "max_xmin_age",
            "samples",
        ],
    )
    samples = read(folder / "txn_scope_samples.csv")
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in samples:
        xs, ys = series.setdefault(f"{r['scope']} {r['job_seconds']} s", ([], []))
        xs.append(_f(r["t"]))
        ys.append(_f(r["oldest_transaction_s"]))
    if series:
        out += "\n" + _plot(
            folder / "txn_scope_age.png",
            "Oldest open transaction (sampled)",
            "seconds into the run",
            "age (s)",
            series,
        )
    return out


def _history(folder: Path) -> str:
    explain = read(folder / "history_explain.csv")
    if not explain:
        return "_not run_\n"
    out = "Claim cost, 500 pending jobs (median of 5 runs; buffers of the last, warm run):\n\n"
    out += _table(
        explain,
        [
            "finished_rows",
            "partial_index",
            "statement",
            "buffers",
            "execution_ms",
            "planning_ms",
            "scans",
        ],
    )
    out += "\nSizes:\n\n" + _table(
        read(folder / "history_sizes.csv"), ["condition", "relation", "kind", "bytes"]
    )
    churn = read(folder / "history_churn.csv")
    if churn:
        out += "\nChurn through leaseq's own lifecycle, autovacuum at the server's defaults:\n\n"
        out += _table(
            churn,
            [
                "arm",
                "reloptions",
                "jobs",
                "seconds",
                "jobs_per_second",
                "fresh_claim_buffers",
                "fresh_claim_ms",
                "worst_claim_buffers",
                "worst_claim_ms",
                "after_claim_buffers",
                "after_claim_ms",
                "end_claim_buffers",
                "end_claim_ms",
                "autovacuum_runs",
                "explicit_vacuums",
            ],
        )
    samples = read(folder / "history_churn_samples.csv")
    for metric, label, logy in (
        ("claim_buffers", "buffers per claim", True),
        ("claim_ms", "claim execution (ms)", True),
        ("n_dead_tup", "dead tuples", False),
    ):
        series: dict[str, tuple[list[float], list[float]]] = {}
        for r in samples:
            xs, ys = series.setdefault(r["arm"], ([], []))
            xs.append(_f(r["t"]))
            ys.append(_f(r[metric]))
        if series:
            out += "\n" + _plot(
                folder / f"history_churn_{metric}.png",
                f"Claim during and after churn: {label}",
                "seconds",
                label,
                series,
                logy=logy,
            )
    drain = read(folder / "history_drain.csv")
    if drain:
        series = {}
        for r in drain:
            xs, ys = series.setdefault(r["arm"], ([], []))
            xs.append(_f(r["first_claim"]))
            ys.append(_f(r["claim_p50_ms"]))
        out += "\nDrain of a backlog, claim latency by position (p50 per bucket):\n\n"
        last = str(max(int(r["bucket"]) for r in drain))
        out += _table(
            [r for r in drain if r["bucket"] in ("0", last)],
            ["arm", "bucket", "first_claim", "claims", "claim_p50_ms", "claim_p99_ms"],
        )
        out += "\n" + _plot(
            folder / "history_drain.png",
            "Claim latency over a drain",
            "claim number",
            "p50 (ms)",
            series,
        )
    return out


def _history_partitions(folder: Path) -> str:
    explain = read(folder / "history_partitions_explain.csv")
    if not explain:
        return "_not run_\n"
    drop = read(folder / "history_partitions_drop.csv")
    return (
        "EXPLAIN (ANALYZE, BUFFERS) of the hot paths over an empty history and over finished "
        "jobs generated straight into the history's day partitions (with as many attempts and "
        "ledger rows); buffers of the warm run, median of 5 executions:\n\n"
        + _table(
            explain,
            ["history_rows", "statement", "buffers", "execution_ms", "planning_ms", "scans"],
        )
        + "\nOne day of history dropped by the retention step (its job and attempt leaves):\n\n"
        + _table(
            drop, ["leaf", "rows", "leaf_and_attempts_bytes", "database_bytes_returned", "drop_ms"]
        )
    )


def _throughput(folder: Path) -> str:
    rows = read(folder / "throughput.csv")
    if not rows:
        return "_not run_\n"
    noop = _by(rows, kind="noop")
    out = _table(
        noop,
        [
            "implementation",
            "workers",
            "batch",
            "jobs",
            "finished",
            "seconds",
            "jobs_per_second",
            "client_cpu_ms_per_job",
            "server_cpu_ms_per_job",
            "machine_cpu_ms_per_job",
        ],
    )
    series = {}
    for impl, batch in sorted({(r["implementation"], r["batch"]) for r in noop}):
        part = _by(noop, implementation=impl, batch=batch)
        series[f"{impl} batch {batch}"] = (
            [_f(r["workers"]) for r in part],
            [_f(r["jobs_per_second"]) for r in part],
        )
    out += "\n" + _plot(
        folder / "throughput_noop.png", "leaseq no-op throughput", "workers", "jobs/s", series
    )
    out += "\nWake-up latency, enqueue commit to claim returned:\n\n"
    out += _table(
        _by(rows, kind="wakeup"),
        [
            "wake_mode",
            "poll_seconds",
            "jobs",
            "claimed",
            "wakeup_p50_ms",
            "wakeup_p99_ms",
            "wakeup_max_ms",
        ],
    )
    return out


def _crash(folder: Path) -> str:
    rows = read(folder / "crash.csv")
    if not rows:
        return "_not run_\n"
    return "Seconds relative to the SIGKILL (database time):\n\n" + _table(
        rows,
        [
            "lease_s",
            "heartbeat_s",
            "reap_every_s",
            "job_s",
            "heartbeat_age_at_kill_s",
            "lease_left_at_kill_s",
            "expired_after_s",
            "reaped_after_s",
            "retry_at_after_s",
            "reclaimed_after_s",
            "finished_after_s",
            "final_status",
            "attempt_count",
            "attempt_outcomes",
        ],
    )


def _peers(folder: Path) -> str:
    rows = read(folder / "peers.csv")
    if not rows:
        return "_not run_\n"
    out = "`loop`: `runtime` is the queue's own worker runtime (for leaseq, `leaseq worker` "
    out += (
        "processes; `batch` is then its concurrency), `api` a hand-written loop of API calls.\n\n"
    )
    out += "`setting`: a peer in an environment of its own at its `default` or `tuned` "
    out += "setting, `batch` then its concurrency limit (0: none set).\n\n"
    out += _table(
        _by(rows, kind="noop"),
        [
            "round",
            "implementation",
            "loop",
            "version",
            "workers",
            "setting",
            "batch",
            "finished",
            "seconds",
            "jobs_per_second",
            "client_cpu_ms_per_job",
            "server_cpu_ms_per_job",
            "claim_p50_ms",
            "loadavg",
        ],
    )
    ratios = []
    noop = _by(rows, kind="noop")
    for mine in (r for r in noop if r["implementation"].startswith("leaseq")):
        for r in noop:
            same = (r["workers"], r["batch"]) == (mine["workers"], mine["batch"])
            if same and not r["implementation"].startswith("leaseq"):
                ratios.append(
                    {
                        "leaseq": mine["implementation"],
                        "peer": r["implementation"],
                        "workers": r["workers"],
                        "batch": r["batch"],
                        "ratio": f"{_f(mine['jobs_per_second']) / _f(r['jobs_per_second']):.2f}",
                    }
                )
    out += "\nEach runtime at its default and at its best setting, per round:\n\n"
    out += _peer_summary(rows)
    out += "\nleaseq / peer no-op throughput at the same workers and batch:\n\n"
    out += _table(ratios, ["leaseq", "peer", "workers", "batch", "ratio"])
    out += "\nScenario 1's workload: `leaseq worker` processes (one slot each; span and claim "
    out += "latency from the database and the workers' histograms), and each peer's own claim "
    out += "and completion calls:\n\n"
    out += _table(
        _by(rows, kind="sleep"),
        [
            "round",
            "implementation",
            "loop",
            "workers",
            "jobs",
            "executions",
            "duplicates",
            "unfinished",
            "jobs_per_second",
            "efficiency",
            "claim_p50_ms",
            "claim_p99_ms",
            "client_cpu_ms_per_job",
            "server_cpu_ms_per_job",
            "loadavg",
        ],
    )
    out += "\nConcurrency limits: each peer's own limit over W processes of handlers that "
    out += "sleep; `max_overlap` is the most handlers running at one instant, from the "
    out += "handlers' own timestamps, across all processes and within one. `limit_held` "
    out += "judges the limit as documented (global, or per process); `global_limit_held` "
    out += "as a limit on the whole fleet:\n\n"
    out += _table(
        _by(rows, kind="limits"),
        [
            "round",
            "implementation",
            "version",
            "workers",
            "limit",
            "limit_scope",
            "jobs",
            "job_seconds",
            "finished",
            "executions",
            "max_overlap",
            "max_overlap_per_process",
            "limit_held",
            "global_limit_held",
            "loadavg",
        ],
    )
    seen: dict[str, str] = {}
    for r in rows:
        if r.get("guarantees"):
            seen[r["implementation"]] = r["guarantees"]
    out += "\nWhat each queue guarantees while doing this:\n\n"
    out += "".join(f"- **{name}**: {text}\n" for name, text in seen.items())
    errors = _by(rows, kind="error")
    if errors:
        out += "\nPeers that could not run:\n\n"
        out += "".join(f"- {r['implementation']} {r['version']}: {r['error']}\n" for r in errors)
    return out


def _ab(folder: Path) -> str:
    rows = read(folder / "ab.csv")
    if not rows:
        return "_not run (opt-in: `python -m bench --only ab`)_\n"
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["workers"], r["batch"], r["implementation"]), []).append(
            _f(r["jobs_per_second"])
        )
    medians = {key: sorted(v)[len(v) // 2] for key, v in groups.items()}
    table = []
    for (workers, batch, impl), median in sorted(
        medians.items(), key=lambda kv: (int(kv[0][0]), int(kv[0][1]), kv[0][2])
    ):
        peer = medians.get((workers, batch, "pgqueuer"))
        table.append(
            {
                "workers": workers,
                "batch": batch,
                "implementation": impl,
                "rounds": str(len(groups[(workers, batch, impl)])),
                "median_jobs_per_second": f"{median:.0f}",
                "all_rounds": " ".join(f"{x:.0f}" for x in groups[(workers, batch, impl)]),
                "vs_pgqueuer": f"{median / peer:.2f}" if peer else "",
            }
        )
    return "Median of interleaved rounds (each round runs every implementation once):\n\n" + _table(
        table,
        [
            "workers",
            "batch",
            "implementation",
            "rounds",
            "median_jobs_per_second",
            "all_rounds",
            "vs_pgqueuer",
        ],
    )


def _ocr(folder: Path) -> str:
    reads = read(folder / "ocr_read.csv")
    loads = read(folder / "ocr_load.csv")
    if not reads:
        return "_not run (opt-in: `python -m bench --only ocr`, needs `pip install '.[ocr]'`)_\n"
    rates: dict[tuple[str, str], list[float]] = {}
    for r in reads:
        rates.setdefault((r["batch_pages"], r["lines_per_call"]), []).append(
            _f(r["pages_per_second"])
        )
    medians = {arm: sorted(v)[len(v) // 2] for arm, v in rates.items()}
    first = medians[(reads[0]["batch_pages"], reads[0]["lines_per_call"])]
    summary = [
        {
            "batch_pages": pages,
            "lines_per_call": per_call,
            "repeats": str(len(rates[(pages, per_call)])),
            "median_pages_per_second": f"{median:.2f}",
            "all_repeats": " ".join(f"{v:.2f}" for v in rates[(pages, per_call)]),
            "vs_first_arm": f"{median / first:.2f}",
        }
        for (pages, per_call), median in medians.items()
    ]
    out = (
        "One process, CPU, one thread per inference, pages of 6 rendered text lines. Detection "
        "runs per page; recognition over the lines of `batch_pages` pages, `lines_per_call` "
        "lines per model call (see bench/ocr.py):\n\n"
    )
    out += _table(
        summary,
        [
            "batch_pages",
            "lines_per_call",
            "repeats",
            "median_pages_per_second",
            "all_repeats",
            "vs_first_arm",
        ],
    )
    out += "\nEvery repeat:\n\n" + _table(
        reads,
        [
            "repeat",
            "batch_pages",
            "lines_per_call",
            "pages",
            "lines",
            "seconds",
            "pages_per_second",
            "cpu_s_per_page",
        ],
    )
    out += "\nModel load (three ONNX sessions), seconds per repeat: "
    out += ", ".join(r["load_seconds"] for r in loads) + "\n"
    return out


def _csv_table(folder: Path, name: str, columns: Sequence[str], caption: str = "") -> str:
    """One CSV's table under its caption, or "_not run_" when the CSV is missing."""
    rows = read(folder / f"{name}.csv")
    if not rows:
        return "_not run_\n"
    return caption + _table(rows, columns)


def _batching(folder: Path) -> str:
    return _csv_table(
        folder,
        "batching",
        ["repeat", "isolation", "job_type", "max_batch", "jobs", "model_calls", "jobs_per_call",
         "run_s", "jobs_per_s"],
        "A backlog enqueued before one worker (`--concurrency 1`) starts; `embed8` batches up "
        "to 8 jobs per model call (`max_wait` 0.5 s), `embed1` calls the model per job (20 ms "
        "per call + 0.5 ms per input; see bench/batching.py):\n\n",
    )  # fmt: skip


def _result_latency(folder: Path) -> str:
    return _csv_table(
        folder, "result_latency", ["face", "jobs", "p50_ms", "p99_ms", "max_ms", "mean_ms"]
    )


def _wakes(folder: Path) -> str:
    env = {r["key"]: r["value"] for r in read(folder / "wakes_env.csv")}
    caption = f"Load: {env['param.load']}.\n\n" if "param.load" in env else ""
    out = _csv_table(
        folder, "wakes", ["runtime", "measure", "n", "p50_ms", "p95_ms", "max_ms", "load_1m"],
        caption,
    )  # fmt: skip
    out += "\nAn idle worker's cost: transactions committed per second in its database.\n\n"
    return out + _csv_table(folder, "wakes_idle", ["case", "seconds", "xact_per_s", "claims_per_s"])


def _pipelines(folder: Path) -> str:
    parts = []
    for name, columns in (
        ("pipelines_fan_out", ["case", "jobs", "seconds", "jobs_per_s"]),
        ("pipelines_completion_rate",
         ["case", "completions", "seconds", "completions_per_s", "children_ready"]),
        ("pipelines_unblock", ["samples", "p50_ms", "p99_ms", "max_ms", "completion_p50_ms"]),
    ):  # fmt: skip
        rows = read(folder / f"{name}.csv")
        if rows:
            parts.append(_table(rows, columns))
    return "\n".join(parts) if parts else "_not run_\n"


def _start(folder: Path) -> str:
    return _csv_table(
        folder,
        "start",
        ["round", "implementation", "version", "workers", "default_batch", "jobs", "started",
         "gap_s", "job_seconds", "start_p50_ms", "start_p99_ms", "start_max_ms", "loadavg",
         "error"],
        "Each runtime's own workers at their defaults, idle; one job enqueued at a time, "
        "`gap_s` apart; from just before the enqueue call to the handler's first line "
        "(see bench/start.py):\n\n",
    )  # fmt: skip


def _lease_renewal(folder: Path) -> str:
    rows = read(folder / "lease_renewal.csv")
    if not rows:
        return "_not run_\n"
    out = _table(
        rows,
        [
            "leases",
            "statistics",
            "arm",
            "statements_per_round",
            "cpu_ms_per_round_min",
            "cpu_ms_per_round_p50",
            "cpu_ms_per_round_max",
            "cpu_us_per_lease",
            "core_pct_at_10s",
            "wal_bytes_per_lease",
        ],
    )
    duties = read(folder / "lease_renewal_passes.csv")
    if duties:
        out += (
            "\nThe leader's duties with the same jobs running (none expired): one reaper pass"
            " and one read of the work estimate, and their share of a core at one each per"
            " 5 s:\n\n"
        )
        out += _table(duties, ["leases", "statistics", "duty", "cpu_ms_per_call", "core_pct_at_5s"])
    return out


def _flow(folder: Path) -> str:
    parts = []
    claims = read(folder / "flow_claim.csv")
    if claims:
        parts.append(
            _table(
                claims,
                [
                    "round",
                    "keys",
                    "limit_per_key",
                    "enqueued",
                    "drained",
                    "jobs_per_s",
                    "keyless_jobs_per_s",
                    "vs_keyless",
                    "client_ms_per_job",
                    "server_ms_per_job",
                    "cpu_vs_keyless",
                ],
            )
        )
    statements = read(folder / "flow_statements.csv")
    if statements:
        parts.append(
            "The same claim and completion on one connection, alone, the commit's flush off: "
            "median wall time of each (µs), and keyless over this row.\n\n"
            + _table(
                statements,
                ["round", "keys", "limit_per_key", "claim_us", "complete_us", "vs_keyless"],
            )
        )
    hot = read(folder / "flow_hot_key.csv")
    if hot:
        parts.append(
            _table(
                hot,
                [
                    "limit",
                    "workers",
                    "job_seconds",
                    "jobs",
                    "jobs_per_s",
                    "allowed_jobs_per_s",
                    "share_of_allowed",
                    "peak_running",
                ],
            )
        )
    plan = read(folder / "flow_explain.csv")
    # Results from before the limits-only claim have one plan, job_claim_keyed's.
    by_statement: dict[str, list[str]] = {}
    for r in plan:
        by_statement.setdefault(r.get("statement") or "job_claim_keyed", []).append(r["plan"])
    for name, lines in by_statement.items():
        text = "\n".join(lines)
        parts.append(
            f"The plan of `{name}` with a saturated key (its backlog walked first) and a free "
            f"key: the saturated key's job probe is never executed.\n\n```\n{text}\n```\n"
        )
    return "\n".join(parts) if parts else "_not run_\n"


SECTIONS: list[tuple[str, Callable[[Path], str]]] = [
    ("1. Claim correctness and scaling (400 jobs x 200 ms)", _claim_scaling),
    ("2. Transaction scope (8 workers)", _txn_scope),
    ("3. History and churn", _history),
    ("3b. Partitioned history: the hot paths over 2,000,000 moved jobs", _history_partitions),
    ("4. No-op throughput and wake-up latency", _throughput),
    ("5. Crash timeline", _crash),
    ("6. Peers, same server, same run", _peers),
    ("6b. Slow jobs into idle workers: enqueue to handler start", _start),
    ("8. Enqueue to result(), no-op job, one at a time", _result_latency),
    ("10. Keeping leases alive: server CPU per round of renewals", _lease_renewal),
    ("A/B: no-op throughput, interleaved rounds", _ab),
    ("7. OCR inference: pages/s one page vs micro-batched, model load", _ocr),
    ("8. Micro-batching from a backlog: jobs per model call", _batching),
    (
        "9. Pipelines: fan-out, fan-in, completion rate, parent completion to child claim",
        _pipelines,
    ),
    ("11. Flow control: keyed claims against keyless, a hot key's limit, the plan", _flow),
    (
        "12. Capacity of one primary: what each unit of the workload costs the server",
        capacity_tables.sizing_table,
    ),
    ("13. Durable sleep and signal: how late each resumes, beside DBOS", _wakes),
]


README_START = "<!-- BENCH HEADLINE (python -m bench report) -->\n"
README_END = "<!-- /BENCH HEADLINE -->"


def readme_section(folder: Path) -> str:
    """The benchmarks page's headline section (docs/benchmarks/index.md): the headline table
    and where it came from; the full report is the site's benchmarks/report.md."""
    env = {r["key"]: r["value"] for r in read(folder / "claim_scaling_env.csv")}
    where = (
        f"Measured on {env['cores']} cores ({env['cpu_model']}), PostgreSQL "
        f"{env['pg_version']}; full tables, plots and parameters in "
        "[the full report](report.md) (bench/results/REPORT.md)."
        if env
        else ""
    )
    peers = read(folder / "peers.csv")
    summary = (
        "\nNo-op throughput of each runtime at its default and at its best setting (best over "
        "W = 1, 4 and 16 worker processes), timed from one start signal to the last "
        "completion, with the machine's load average when the run started; other work "
        "shares this machine, so compare within a round:\n\n" + _peer_summary(peers)
        if peers
        else ""
    )
    return f"{_headline(folder)}{summary}\n{where}\n"


def update_readme(readme: Path, folder: Path) -> None:
    """Replace the headline section of ``readme`` (the benchmarks page) with the one
    generated from ``folder``."""
    text = readme.read_text()
    start = text.index(README_START) + len(README_START)
    end = text.index(README_END)
    readme.write_text(text[:start] + readme_section(folder) + text[end:])


def generate(folder: Path) -> Path:
    """Write ``folder/REPORT.md`` and its plots from the CSV files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = [
        "# leaseq benchmarks\n",
        "Generated by `python -m bench report` from the CSV files in this folder; do not edit.\n"
        "Absolute numbers belong to this machine; compare implementations only within one run. "
        "CPU per job: `client` is the worker processes, `server` the PostgreSQL processes, "
        "`machine` everything on the machine (including unrelated load).\n",
        "## Headline\n",
        _headline(folder),
        "## Environment\n",
        _environment(folder),
    ]
    for title, section in SECTIONS:
        parts += [f"## {title}\n", section(folder)]
    path = folder / "REPORT.md"
    path.write_text("\n".join(parts))
    return path
