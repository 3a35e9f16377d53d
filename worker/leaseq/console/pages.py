"""The console's pages that only read: each one short, bounded transaction through
:class:`leaseq.core.console.Console` (sql/queries/console.sql), rendered by the
:class:`~leaseq.console.rendering.Renderer`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from leaseq.console.params import blank, dead_filters, int_field, time_field
from leaseq.console.rendering import Renderer, text
from leaseq.core.console import BULK_LIMIT, HELD_SHOWN, Console, JobFilter
from leaseq.core.errors import InvalidJob, LeaseqError
from leaseq.core.models import STEP_UNCERTAIN_CODE, JobStatus

#: Lists the operator's WorkerPools: (pools, None), or (None, why they cannot be read).
PoolsSource = Callable[[], tuple[list[Mapping[str, Any]] | None, str | None]]


@dataclass(frozen=True)
class Panel:
    """An extra overview panel (the place later features plug in): a title, a Jinja template
    (autoescaped) and a loader that reads what it shows through the console face."""

    title: str
    template: str
    load: Callable[[Console], Mapping[str, Any]]


def _status(value: str | None) -> JobStatus | None:
    status = blank(value)
    if status is not None and status not in {str(s) for s in JobStatus}:
        raise InvalidJob("status", f"{status!r} is not a job status")
    return None if status is None else JobStatus(status)


def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


def go_overview(request: Request) -> Response:
    return RedirectResponse(request.scope.get("root_path", "") + "/")


class Pages:
    """One method per page; the overview and the workers page refresh themselves every
    ``refresh_seconds``."""

    def __init__(
        self,
        console: Console,
        render: Renderer,
        *,
        refresh_seconds: float,
        pools: PoolsSource,
        panels: Sequence[Panel],
    ) -> None:
        self.console = console
        self.render = render
        self.refresh_seconds = refresh_seconds
        self.read_pools = pools
        self.panels = panels

    def _role(self) -> dict[str, Any]:
        return {"role": self.console.role()}

    def overview(self, request: Request) -> Response:
        extra = []
        for panel in self.panels:
            try:
                body = self.render.fragment(panel.template, panel.load(self.console))
            except LeaseqError as exc:
                body = f"unavailable: {text(exc)}"
            extra.append((panel.title, body))
        return self.render(
            request,
            "overview.html",
            {
                **self._role(),
                "overview": self.console.overview(),
                "held_shown": HELD_SHOWN,
                "panels": extra,
                "refresh": self.refresh_seconds,
            },
        )

    def jobs(self, request: Request) -> Response:
        q = request.query_params
        filters = JobFilter(
            status=_status(q.get("status")),
            queue=blank(q.get("queue")),
            job_type=blank(q.get("job_type")),
            error_code=blank(q.get("error_code")),
            key=blank(q.get("key")),
            created_from=time_field("from", q.get("from")),
            created_to=time_field("to", q.get("to")),
        )
        page = self.console.jobs(filters, before=int_field("before", q.get("before")))
        kept = {k: v for k, v in q.items() if k != "before" and v}
        older = None
        if page.next_before is not None:
            older = "?" + urlencode({**kept, "before": page.next_before})
        return self.render(
            request,
            "jobs.html",
            {
                "page": page,
                "filters": filters,
                "query": kept,
                "older": older,
                "statuses": [str(s) for s in JobStatus],
            },
        )

    def job(self, request: Request) -> Response:
        job_id = int(request.path_params["job_id"])
        row, timeline = self.console.job(job_id)
        if row is None:
            return self.render(
                request,
                "error.html",
                {"title": "No such job", "message": f"job {job_id} is not in this database"},
                404,
            )
        q = request.query_params
        links = self.console.job_links(
            job_id,
            parents_after=int_field("parents_after", q.get("parents_after")) or 0,
            children_after=int_field("children_after", q.get("children_after")) or 0,
        )
        # Steps and streams are deleted with their job when it leaves the hot table.
        steps = (
            self.console.job_steps(job_id, after=q.get("steps_after") or "")
            if row["place"] == "hot"
            else None
        )
        return self.render(
            request,
            "job.html",
            {
                **self._role(),
                "job": row,
                "timeline": timeline,
                "links": links,
                "steps": steps,
                "step_uncertain_code": STEP_UNCERTAIN_CODE,
            },
        )

    def pipelines(self, request: Request) -> Response:
        q = request.query_params
        unfinished = blank(q.get("unfinished")) is not None
        rows, older = self.console.pipelines(
            before=int_field("before", q.get("before")), unfinished=unfinished
        )
        older_href = None
        if older is not None:
            older_href = "?" + urlencode(
                {"before": older, **({"unfinished": "1"} if unfinished else {})}
            )
        return self.render(
            request,
            "pipelines.html",
            {"rows": rows, "older": older_href, "unfinished": unfinished},
        )

    def pipeline(self, request: Request) -> Response:
        pipeline_id = int(request.path_params["pipeline_id"])
        q = request.query_params
        row, jobs = self.console.pipeline(
            pipeline_id,
            after=int_field("after", q.get("after")) or 0,
            status=_status(q.get("status")),
        )
        if row is None:
            return self.render(
                request,
                "error.html",
                {"title": "No such pipeline", "message": f"pipeline {pipeline_id} is not here"},
                404,
            )
        return self.render(
            request, "pipeline.html", {**self._role(), "pipeline": row, "jobs": jobs}
        )

    def flow(self, request: Request) -> Response:
        q = request.query_params
        queue = blank(q.get("queue"))

        def cursor(prefix: str) -> tuple[str, str] | None:
            after_queue = q.get(prefix + "q")
            return None if after_queue is None else (after_queue, q.get(prefix + "k", ""))

        page = self.console.flow(
            queue=queue,
            limits_after=cursor("l"),
            keys_after=cursor("k"),
            blocked_after=cursor("b"),
        )

        def next_href(prefix: str, nxt: tuple[str, str] | None) -> str | None:
            if nxt is None:
                return None
            kept = {k: v for k, v in q.items() if k not in {prefix + "q", prefix + "k"}}
            return "?" + urlencode({**kept, prefix + "q": nxt[0], prefix + "k": nxt[1]})

        return self.render(
            request,
            "flow.html",
            {
                "flow": page,
                "queue": queue,
                "limits_next": next_href("l", page.limits.next_after),
                "keys_next": next_href("k", page.keys.next_after),
                "blocked_next": next_href("b", page.blocked.next_after),
            },
        )

    def dead(self, request: Request) -> Response:
        filters = dead_filters(request.query_params)
        rows, selection = self.console.dead(
            queue=filters["queue"], job_type=filters["job_type"], error_code=filters["error_code"]
        )
        return self.render(
            request,
            "dead.html",
            {
                **self._role(),
                "rows": rows,
                "selection": selection,
                "filters": filters,
                "limit": BULK_LIMIT,
            },
        )

    def cancel_preview(self, request: Request) -> Response:
        q = request.query_params
        queue, job_type = blank(q.get("queue")), blank(q.get("job_type"))
        selection = self.console.select_pending(queue=queue or "", job_type=job_type)
        return self.render(
            request,
            "cancel.html",
            {
                **self._role(),
                "queue": queue,
                "job_type": job_type,
                "selection": selection,
                "limit": BULK_LIMIT,
            },
        )

    def workers(self, request: Request) -> Response:
        return self.render(
            request,
            "workers.html",
            {"workers": self.console.workers(), "refresh": self.refresh_seconds},
        )

    def worker_pools(self, request: Request) -> Response:
        found, why = self.read_pools()
        return self.render(request, "pools.html", {"pools": found, "why": why})

    def schedules(self, request: Request) -> Response:
        return self.render(request, "schedules.html", {"schedules": self.console.schedules()})

    def audit(self, request: Request) -> Response:
        return self.render(request, "audit.html", {"rows": self.console.audit()})
