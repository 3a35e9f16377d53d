"""Build the leaseq Grafana dashboard as code (grafana-foundation-sdk) into leaseq.json.

The chart ships leaseq.json in a ConfigMap for the Grafana dashboard sidecar. Never edit the
JSON by hand: change this file and run

    python charts/leaseq/dashboards/build.py          # rewrite leaseq.json
    python charts/leaseq/dashboards/build.py --check  # exit 1 if leaseq.json is stale

Every query filters on the `namespace` and `queue` variables; tests/chart checks that every
metric name here is exported by a live worker or operator, and that every exported one is
charted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueGraphMode,
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

OUTPUT = Path(__file__).with_name("leaseq.json")
UID = "leaseq-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Applied to every series: the namespace and queue the viewer picked.
SEL = 'namespace=~"$namespace", queue=~"$queue"'
NS = 'namespace=~"$namespace"'


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    """A range query on the dashboard's datasource variable."""
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref)
        .range()
        .datasource(DATASOURCE)
    )


def graph(
    title: str, description: str, unit: str, *queries: prometheus.Dataquery, stacked: bool = False
) -> timeseries.Panel:
    """A time series panel, legend as a table at the bottom, optionally stacked."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .min(0)
        .datasource(DATASOURCE)
        .draw_style(GraphDrawStyle.LINE)
        .fill_opacity(20 if stacked else 5)
        .line_width(1)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .height(8)
        .span(12)
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(StackingMode.NORMAL))
    for q in queries:
        panel = panel.with_target(q)
    return panel


def single(title: str, description: str, expr: str) -> stat.Panel:
    """A one-number panel."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr, title))
        .graph_mode(BigValueGraphMode.AREA)
        .height(4)
        .span(6)
    )


def quantiles(metric: str, by: str, selector: str) -> list[prometheus.Dataquery]:
    """p50/p95/p99 of a histogram, per `by` label(s)."""
    out = []
    group = f"le, {by}" if by else "le"
    legend = f"{{{{{by}}}}} " if by else ""
    for ref, q in zip("ABC", ("0.5", "0.95", "0.99"), strict=True):
        expr = (
            f"histogram_quantile({q}, sum by ({group}) "
            f"(rate({metric}_bucket{{{selector}}}[$__rate_interval])))"
        )
        out.append(query(expr, f"{legend}p{int(float(q) * 100)}", ref))
    return out


def build() -> dashboard.Dashboard:
    """The whole dashboard: backlog, throughput and outcomes, latency, scaling."""
    return (
        dashboard.Dashboard("leaseq")
        .uid(UID)
        .description("leaseq queues: backlog, throughput, outcomes, latency and scaling.")
        .tags(["leaseq", "queue"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .editable()
        .with_variable(
            dashboard.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .current(VariableOption(selected=True, text="Prometheus", value="prometheus"))
        )
        .with_variable(
            dashboard.QueryVariable("namespace")
            .label("Namespace")
            .datasource(DATASOURCE)
            .query({"query": "label_values(leaseq_queue_jobs, namespace)", "refId": "ns"})
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
        )
        .with_variable(
            dashboard.QueryVariable("queue")
            .label("Queue")
            .datasource(DATASOURCE)
            .query({"query": f"label_values(leaseq_queue_jobs{{{NS}}}, queue)", "refId": "queue"})
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
        )
        .with_row(dashboard.Row("Backlog"))
        .with_panel(
            graph(
                "Jobs by state",
                "Jobs per queue and state, counted in PostgreSQL by the operator at scrape time.",
                "short",
                query(f"max by (queue, state) (leaseq_queue_jobs{{{SEL}}})", "{{queue}} {{state}}"),
                stacked=True,
            )
        )
        .with_panel(
            graph(
                "Oldest ready job age",
                "How long the oldest ready job has waited. Rising: the pool is too small.",
                "s",
                query(
                    f"max by (queue) (leaseq_queue_oldest_ready_age_seconds{{{SEL}}})", "{{queue}}"
                ),
            )
        )
        .with_panel(
            graph(
                "Heartbeat age of running jobs",
                "Oldest heartbeat among running jobs. Above the lease, the reaper should act.",
                "s",
                query(
                    f"max by (queue) (leaseq_queue_max_heartbeat_age_seconds{{{SEL}}})",
                    "{{queue}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Jobs waiting for a signal",
                "Jobs waiting for a signal (ctx.wait_for), holding no worker and counted as"
                " scheduled, and how long the oldest has waited: rising, nobody answers it.",
                "short",
                query(
                    f"max by (queue) (leaseq_queue_signal_waiting_jobs{{{SEL}}})",
                    "{{queue}} waiting",
                ),
                query(
                    f"max by (queue) (leaseq_queue_oldest_signal_wait_age_seconds{{{SEL}}}) / 3600",
                    "{{queue}} oldest wait (hours)",
                    "B",
                ),
            )
        )
        .with_panel(
            graph(
                "Live workers and jobs in flight",
                "Registered live workers per queue, and the jobs they are running right now.",
                "short",
                query(f"max by (queue) (leaseq_queue_workers{{{SEL}}})", "{{queue}} workers"),
                query(
                    f"sum by (queue) (leaseq_jobs_in_flight{{{SEL}}})", "{{queue}} in flight", "B"
                ),
            )
        )
        .with_row(dashboard.Row("Throughput and outcomes"))
        .with_panel(
            graph(
                "Jobs finished by outcome",
                "Finished jobs per second by outcome, as the workers count them.",
                "ops",
                query(
                    "sum by (queue, outcome) "
                    f"(rate(leaseq_jobs_finished_total{{{SEL}}}[$__rate_interval]))",
                    "{{queue}} {{outcome}}",
                ),
                stacked=True,
            )
        )
        .with_panel(
            graph(
                "Claims",
                "Jobs claimed per second.",
                "ops",
                query(
                    f"sum by (queue) (rate(leaseq_jobs_claimed_total{{{SEL}}}[$__rate_interval]))",
                    "{{queue}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Effects not written",
                "Completions whose effect key another job's effect already held (keys are per"
                " queue and job type, shared by every producer): the job succeeded, its effect"
                " was not written.",
                "ops",
                query(
                    "sum by (queue, job_type) "
                    f"(rate(leaseq_effects_not_written_total{{{SEL}}}[$__rate_interval]))",
                    "{{queue}} {{job_type}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Lease expirations and fencing",
                "Expired leases the reaper put back (retried) or buried (dead); leases workers"
                " lost; stale calls refused by the fencing token; jobs stopped at a durable step"
                " whose outcome is uncertain (leaseq steps resolve settles them).",
                "ops",
                query(
                    "sum by (queue, outcome) "
                    f"(rate(leaseq_reaped_total{{{SEL}}}[$__rate_interval]))",
                    "{{queue}} reaped {{outcome}}",
                ),
                query(
                    f"sum by (queue) (rate(leaseq_lease_losses_total{{{SEL}}}[$__rate_interval]))",
                    "{{queue}} lease lost",
                    "B",
                ),
                query(
                    f"sum by (queue) (rate(leaseq_fenced_calls_total{{{SEL}}}[$__rate_interval]))",
                    "{{queue}} fenced",
                    "C",
                ),
                query(
                    "sum by (queue) "
                    f"(rate(leaseq_steps_uncertain_total{{{SEL}}}[$__rate_interval]))",
                    "{{queue}} stopped at an uncertain step",
                    "D",
                ),
            )
        )
        .with_panel(
            graph(
                "Lease renewals",
                "Heartbeats that renewed a lease, per second.",
                "ops",
                query(
                    "sum by (queue) "
                    f"(rate(leaseq_lease_renewals_total{{{SEL}}}[$__rate_interval]))",
                    "{{queue}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Schedule slots",
                "Schedule slots per second: enqueued, skipped (the previous slot's job was"
                " unfinished), missed (downtime: only the latest fires), failed scheduler ticks.",
                "ops",
                query(
                    "sum by (outcome) "
                    f"(rate(leaseq_schedule_slots_total{{{NS}}}[$__rate_interval]))",
                    "{{outcome}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Schedule lateness",
                "Seconds since the latest due slot no scheduler has fired (0: up to date; a few"
                " seconds is one reap interval).",
                "s",
                query(f"max(leaseq_schedule_late_seconds{{{NS}}})", "late"),
            )
        )
        .with_row(dashboard.Row("Flow control"))
        .with_panel(
            graph(
                "Claimable vs ready jobs",
                "Ready jobs per queue, and those workers could claim now (keyless, plus per"
                " key the smaller of its ready jobs and free units of its limit): the operator"
                " scales on claimable. A wide gap is a backlog of keys at their limits.",
                "short",
                query(
                    f"sum by (queue) (leaseq_queue_claimable_jobs{{{SEL}}})", "{{queue}} claimable"
                ),
                query(
                    f'sum by (queue) (leaseq_queue_jobs{{{SEL}, state="ready"}})', "{{queue}} ready"
                ),
            )
        )
        .with_panel(
            graph(
                "Saturated keys and blocked aggregates",
                "Keys with ready jobs and no free unit of their limit; aggregates whose head"
                " job is dead (nothing behind it runs: retry or skip it, leaseq limits keys).",
                "short",
                query(
                    f"sum by (queue) (leaseq_flow_saturated_keys{{{SEL}}})", "{{queue}} saturated"
                ),
                query(
                    f"sum by (queue) (leaseq_flow_blocked_aggregates{{{SEL}}})", "{{queue}} blocked"
                ),
            )
        )
        .with_panel(
            single(
                "Limit units repaired",
                "Units of per-key limits the reaper found held by no running attempt, and freed"
                " (expected 0: anything else is a bug to report).",
                f"sum(increase(leaseq_flow_repairs_total{{{NS}}}[1h]))",
            )
        )
        .with_row(dashboard.Row("Latency"))
        .with_panel(
            graph(
                "Job duration",
                "p50 / p95 / p99 of a job's run time, per queue.",
                "s",
                *quantiles("leaseq_job_duration_seconds", "queue", SEL),
            )
        )
        .with_panel(
            graph(
                "Claim latency",
                "p50 / p95 / p99 of one claim round trip to PostgreSQL.",
                "s",
                *quantiles("leaseq_claim_latency_seconds", "", NS),
            )
        )
        .with_row(dashboard.Row("Scaling"))
        .with_panel(
            graph(
                "Desired vs current replicas",
                "What the operator wants per WorkerPool, and what its Deployment has.",
                "short",
                query(
                    f"max by (workerpool) (leaseq_workerpool_desired_replicas{{{NS}}})",
                    "{{workerpool}} desired",
                ),
                query(
                    f"max by (workerpool) (leaseq_workerpool_current_replicas{{{NS}}})",
                    "{{workerpool}} current",
                    "B",
                ),
            )
        )
        .with_panel(
            graph(
                "Failed pod annotations",
                "Pod annotation patches (deletion cost, safe-to-evict) that failed per"
                " WorkerPool, e.g. refused by an admission policy. Scaling goes on; the"
                " WorkerPool's PodsAnnotated condition has the API server's message.",
                "short",
                query(
                    "sum by (workerpool) (increase("
                    f"leaseq_workerpool_annotation_failures_total{{{NS}}}[$__rate_interval]))",
                    "{{workerpool}}",
                ),
            )
        )
        .with_panel(
            single(
                "Reaper leaders",
                "Operators holding the reaper leadership: exactly 1 is healthy.",
                f"sum(leaseq_reaper_leader{{{NS}}})",
            )
        )
        .with_panel(
            single(
                "Operator database reachable",
                "1 while an operator can read PostgreSQL. At 0 the queue series are missing:"
                " the backlog panels go blank and the queue alerts cannot fire.",
                f"max(leaseq_operator_database_up{{{NS}}})",
            )
        )
        .with_panel(
            single(
                "Queues folded into _other",
                "Queues beyond the operator's --metrics-max-queues cap, summed under"
                ' queue="_other" (above 0: raise the cap, or find who creates so many queues).',
                f"max(leaseq_queue_series_folded{{{NS}}})",
            )
        )
        .with_panel(
            single(
                "Draining workers",
                "Workers that got SIGTERM and are finishing or releasing their jobs.",
                f"sum(leaseq_worker_draining{{{NS}}})",
            )
        )
        .with_panel(
            single(
                "Loading workers",
                "Workers still running on_startup (a model load): not ready, and counted by the"
                " operator as capacity already coming.",
                f"sum(leaseq_worker_loading{{{NS}}})",
            )
        )
        .with_panel(
            graph(
                "Worker start-up",
                "How long on_startup (the model load) took, slowest and mean over the workers"
                " that finished it.",
                "s",
                query(f"max(leaseq_worker_startup_seconds{{{NS}}})", "slowest"),
                query(f"avg(leaseq_worker_startup_seconds{{{NS}}} > 0)", "mean", "B"),
            )
        )
        .with_panel(
            single(
                "Handler child processes started (1h)",
                "With --isolation process: one per slot at start-up, then one for each child"
                " killed (max runtime, cancel, lost lease) or crashed. A steady climb is a"
                " crash loop (see the attempts' CHILD_CRASHED errors).",
                f"sum(increase(leaseq_child_processes_started_total{{{NS}}}[1h]))",
            )
        )
        .with_panel(
            single(
                "Late heartbeats (1h)",
                "Heartbeat wake-ups more than an interval late: in thread mode, a handler"
                " holding the GIL or blocking in C (leases expire under running jobs). Run"
                " such pools with --isolation process.",
                f"sum(increase(leaseq_worker_heartbeat_late_total{{{NS}}}[1h]))",
            )
        )
        .with_panel(
            single(
                "Ready jobs no live worker serves",
                "Ready jobs of a type none of their queue's live workers has a handler for (a"
                " deploy that has not shipped it yet, or a producer's typo); they wait, no"
                " attempt spent. See leaseq status.",
                f"sum(leaseq_queue_unserved_jobs{{{NS}}})",
            )
        )
        .with_panel(
            single(
                "Database failovers (1h)",
                "Workers that reconnected to another primary (a database failover) and voided"
                " the leases then in flight: their jobs run again once those leases expire."
                " See the operations guide's failover page.",
                f"sum(increase(leaseq_worker_failovers_total{{{NS}}}[1h]))",
            )
        )
    )


def render() -> str:
    """The dashboard JSON exactly as shipped (stable key order, trailing newline)."""
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if leaseq.json is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__)}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
