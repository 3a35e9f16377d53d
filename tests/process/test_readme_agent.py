"""README.md's agent job, run as written: its handler block is the ``--app`` module of a real
``leaseq worker`` process (behind stand-ins for the model and the payment API, which keep
their calls in files), and its producer block enqueues, signals, reads the stream and the
result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import leaseq
from support.readme import README
from support.workers import Workers

HEADING = "## An agent job"

# The model and the payment API the README's handler calls: each bills (or pays) once per
# key, as real gateways and payment APIs dedupe, and writes what it did to a file.
STAND_INS = """
import json
from pathlib import Path


class _Model:
    def complete(self, prompt, idempotency_key):
        with Path("model-calls").open("a") as f:
            f.write(json.dumps([idempotency_key, prompt]) + "\\n")
        return f"reply to {prompt}"


class _Payments:
    def refund(self, order, key):
        with Path("refunds").open("a") as f:
            f.write(json.dumps([key, order]) + "\\n")
        return {"refunded": order}

    def find(self, key):
        return None


llm, payments = _Model(), _Payments()
"""


def python_blocks() -> list[str]:
    """The ``python`` blocks of the README's agent section."""
    text = README.read_text()
    section = text[text.index(HEADING) + len(HEADING) :]
    section = section[: section.index("\n## ")]
    return [part[: part.index("```")] for part in section.split("```python\n")[1:]]


def test_the_readme_agent_job_runs_as_written(
    database_url: str, queue: leaseq.Queue, tmp_path: Path
) -> None:
    handler, producer = python_blocks()
    code = [line for line in handler.splitlines() if line.strip()]
    assert len(code) < 20, "the README shows the agent job in under 20 lines of code"
    (tmp_path / "readme_agent.py").write_text(STAND_INS + handler)
    workers = Workers(database_url, tmp_path, pythonpath=[tmp_path])
    try:
        workers.start("agent-1", "--app", "readme_agent:registry", "--queue", "support")
        printed: list[Any] = []
        scope = {"queue": queue, "email": "my order 7 came broken", "print": printed.append}
        # Its stream and result() wait unbounded, as the README's do: the suite's time limit
        # on every test (tests/support/time_limit.py) bounds them here.
        exec(compile(producer, "README.md", "exec"), scope)
        job = scope["job"]
    finally:
        workers.stop_all()
    summary = "reply to Summarise: my order 7 came broken"
    verdict = f"reply to Refund? {summary}"
    assert printed == [summary, verdict, {"verdict": verdict}]
    calls = [json.loads(line) for line in (tmp_path / "model-calls").read_text().splitlines()]
    assert [prompt for _, prompt in calls] == [
        "Summarise: my order 7 came broken",
        f"Refund? {summary}",
    ]
    refunds = [json.loads(line) for line in (tmp_path / "refunds").read_text().splitlines()]
    assert [order for _, order in refunds] == [7], "approved: paid once"
    assert len({key for key, _ in calls + refunds}) == 3, "each step its own key"
    assert {"read", "decide", "pay"} <= {s.name for s in queue.steps(job) if s.recorded}
