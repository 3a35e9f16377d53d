"""What the fault tests share: where their handlers live, and a worker's command line."""

from __future__ import annotations

from pathlib import Path

#: Put on the workers' PYTHONPATH, for ``--app fault_apps:registry``.
HERE = Path(__file__).parent


def worker_args(
    *,
    queue: str = "q",
    concurrency: int = 2,
    lease: float = 2.0,
    heartbeat: float = 0.5,
    poll: float = 0.5,
    drain: float = 5.0,
    listen: bool = True,
    prepared_statements: bool = True,
) -> list[str]:
    return [
        "--app", "fault_apps:registry",
        "--queue", queue,
        "--concurrency", str(concurrency),
        "--lease-seconds", str(lease),
        "--heartbeat-seconds", str(heartbeat),
        "--poll-seconds", str(poll),
        "--drain-seconds", str(drain),
        "--listen", str(listen).lower(),
        "--prepared-statements", str(prepared_statements).lower(),
        "--log-level", "INFO",
    ]  # fmt: skip
