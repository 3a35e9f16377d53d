"""Interleaved A/B: leaseq's no-op throughput against the fastest peer, repeated round-robin.

On a shared machine, load drifts between one configuration and the next; running every
implementation once per round, several rounds, and comparing medians keeps that drift out of
the ratios. Not part of the default run: ``python -m bench --only ab``.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from bench import noop, peers
from bench.context import Context
from bench.env import scratch_database

NAME = "ab"


def run(ctx: Context) -> None:
    rounds, jobs, cap = (1, 1000, 5.0) if ctx.quick else (3, 10_000, 30.0)
    configs = ((4, 10),) if ctx.quick else ((4, 10), (16, 10), (4, 50))
    impls: list[noop.Implementation] = [*noop.leaseq_variants(), peers.Pgqueuer()]
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        urls = {}
        for impl in impls:
            label = impl.name.replace("+", "_")
            urls[impl.name] = stack.enter_context(
                scratch_database(ctx.server_url, f"ab_{label}", migrate=False)
            )
            impl.install(urls[impl.name])
        for round_ in range(rounds):
            for workers, batch in configs:
                for impl in impls:
                    row = noop.measure(
                        impl,
                        urls[impl.name],
                        jobs=jobs,
                        workers=workers,
                        batch=batch,
                        cap_seconds=cap,
                    )
                    ctx.log(
                        f"ab round {round_} {impl.name} W={workers} batch={batch}: "
                        f"{row['jobs_per_second']} jobs/s"
                    )
                    rows.append({"round": round_, **row})
    recorder = ctx.recorder(NAME)
    recorder.params({"rounds": rounds, "jobs": jobs, "cap_seconds": cap, "configs": configs})
    recorder.table(NAME, rows)
