"""An agent-style job with paid calls as durable steps: a crash between two paid calls pays
for neither again.

::

    leaseq worker --app leaseq.examples.agent:registry --queue agent

Each ``agent.answer`` job (payload ``{"question": ..., "ledger": path}``) makes two paid
calls to a simulated model gateway, each a durable step (``ctx.step``): ``plan``, then
``answer``. The gateway bills each call once per idempotency key, appending a line to the
``ledger`` file, as real gateways and payment APIs dedupe by key. The steps pass their
``ctx.step_key`` and say ``idempotent=True``, so an attempt that finds a step whose outcome is
uncertain (its worker died after the gateway billed and before the result was recorded) calls
again under the same key, and is not billed again. A step recorded by an earlier attempt is
not called at all. ``AGENT_CALL_SECONDS`` (default 0) is how long a call takes after it is
billed, for demonstrations: the window in which a worker can die with the call paid and
unrecorded. Progress goes to the job's stream (``ctx.emit``). This module uses only the
public ``leaseq`` API.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from leaseq import JobContext, Registry

registry = Registry()
#: Seconds a gateway call takes after it is billed (demonstrations only).
CALL_SECONDS_ENV = "AGENT_CALL_SECONDS"


def gateway(ledger: Path, key: str, prompt: str) -> str:
    """A simulated paid model call: billed once per ``key`` (a line in ``ledger``), then
    answered. Processes append whole lines, so concurrent bills do not interleave."""
    billed = ledger.read_text().splitlines() if ledger.exists() else []
    if key not in billed:
        with ledger.open("a") as f:
            f.write(key + "\n")
    time.sleep(float(os.environ.get(CALL_SECONDS_ENV, "0") or 0))
    return f"reply to {prompt!r}"


@registry.job("agent.answer")
def answer(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    ledger = Path(payload["ledger"])
    question = payload["question"]
    plan = ctx.step(
        "plan", lambda: gateway(ledger, ctx.step_key, f"plan: {question}"), idempotent=True
    )
    ctx.emit({"done": "plan"})
    reply = ctx.step(
        "answer", lambda: gateway(ledger, ctx.step_key, f"answer: {plan}"), idempotent=True
    )
    ctx.emit({"done": "answer"})
    return {"question": question, "answer": reply}
