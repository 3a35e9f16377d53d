"""The console's form posts: retry or cancel one job, settle a job's uncertain step, retry
the dead jobs a filter selects, cancel the pending jobs of a queue, cancel a pipeline. Each
reads its form through :func:`~leaseq.console.guard.form_of` (the CSRF check), acts in one
audited statement through the console face, logs one line naming the actor, and renders what
it did."""

from __future__ import annotations

import logging
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from leaseq.console.guard import form_of
from leaseq.console.params import blank, dead_filters
from leaseq.console.rendering import Renderer
from leaseq.core import validation
from leaseq.core.console import Console
from leaseq.core.errors import InvalidJob

log = logging.getLogger("leaseq.console")


class Actions:
    """One method per form post."""

    def __init__(self, console: Console, render: Renderer) -> None:
        self.console = console
        self.render = render

    def _acted(
        self,
        request: Request,
        action: str,
        asked: list[int],
        done: list[int],
        back: str,
        *,
        why: str = "",
    ) -> Response:
        """The answer page of an action: how many of the jobs asked for it took, and ``why``
        none did when that is known (a step resolve says it as the CLI does)."""
        log.info(
            "console action",
            extra={"actor": request.state.actor, "action": action, "jobs": len(done)},
        )
        # A cancel takes the jobs' unfinished descendants with them: counted apart.
        mine = len(set(done) & set(asked))
        return self.render(
            request,
            "done.html",
            {
                "action": action,
                "asked": len(asked),
                "done": done,
                "mine": mine,
                "descendants": len(done) - mine,
                "back": back,
                "why": why,
            },
        )

    async def job(self, request: Request) -> Response:
        job_id = int(request.path_params["job_id"])
        action = request.path_params["action"]
        form = await form_of(request)
        reason, actor = form.get("reason", ""), request.state.actor
        if action == "retry":
            done = self.console.retry_dead([job_id], actor=actor, reason=reason)
            return self._acted(request, "retried", [job_id], done, f"jobs/{job_id}")
        if action == "cancel":
            done = self.console.cancel([job_id], actor=actor, reason=reason)
            return self._acted(request, "cancelled", [job_id], done, f"jobs/{job_id}")
        return self.render(
            request, "error.html", {"title": "No such action", "message": action}, 404
        )

    async def step_resolve(self, request: Request) -> Response:
        """Settles the posted step: ``settle`` is ``result`` (record the posted JSON
        ``result``) or ``retry`` (run the step again). A bad choice, bad JSON or an oversized
        result is refused before anything is written."""
        job_id = int(request.path_params["job_id"])
        form = await form_of(request)
        step, settle = form.get("step", ""), form.get("settle")
        if settle not in ("result", "retry"):
            raise InvalidJob("settle", f"must be result or retry, got {settle!r}")
        retry = settle == "retry"
        result = None if retry else validation.json_text("result", form.get("result", ""))
        done = self.console.resolve_step(
            job_id,
            step,
            result=result,
            retry=retry,
            actor=request.state.actor,
            reason=form.get("reason", ""),
        )
        settled = "to run again" if retry else "recorded"
        return self._acted(
            request,
            f"resumed (step {step!r} {settled})",
            [job_id],
            [job_id] if done else [],
            f"jobs/{job_id}",
            why="" if done else self.console.step_unsettled(job_id, step),
        )

    async def dead_retry(self, request: Request) -> Response:
        form = await form_of(request)
        filters = dead_filters(form)
        selection = self.console.select_dead(
            queue=filters["queue"], job_type=filters["job_type"], error_code=filters["error_code"]
        )
        done = self.console.retry_dead(
            selection.ids,
            actor=request.state.actor,
            reason=form.get("reason", ""),
            filter={k: v for k, v in filters.items() if v is not None},
        )
        back = "dead?" + urlencode({k: v for k, v in filters.items() if v})
        return self._acted(request, "retried", selection.ids, done, back)

    async def cancel_pending(self, request: Request) -> Response:
        form = await form_of(request)
        queue, job_type = blank(form.get("queue")), blank(form.get("job_type"))
        selection = self.console.select_pending(queue=queue or "", job_type=job_type)
        done = self.console.cancel(
            selection.ids,
            actor=request.state.actor,
            reason=form.get("reason", ""),
            filter={"queue": queue, "job_type": job_type, "status": "pending"},
        )
        back = "jobs?" + urlencode({"queue": queue or "", "status": "pending"})
        return self._acted(request, "cancelled", selection.ids, done, back)

    async def pipeline_cancel(self, request: Request) -> Response:
        pipeline_id = int(request.path_params["pipeline_id"])
        form = await form_of(request)
        actor = request.state.actor
        cancelled, running = self.console.cancel_pipeline(
            pipeline_id, actor=actor, reason=form.get("reason", "")
        )
        log.info(
            "console action",
            extra={
                "actor": actor,
                "action": "cancel_pipeline",
                "pipeline": pipeline_id,
                "jobs": cancelled,
            },
        )
        return self.render(
            request,
            "pipeline_cancelled.html",
            {"pipeline_id": pipeline_id, "cancelled": cancelled, "running": running},
        )
