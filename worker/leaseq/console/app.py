"""The console's ASGI application: server-rendered pages over :class:`leaseq.core.console.Console`.

Every page is one short, bounded transaction (sql/queries/console.sql). Form posts check the
Origin and a CSRF token (a random cookie the form repeats: double submit, SameSite=Strict).
Payloads, results, checkpoints and progress reach a page only through the redaction hook;
error texts and tracebacks through :func:`leaseq.core.redact.redact`. Errors render as a page
saying what happened, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from leaseq.console.auth import Auth, LocalOnly, Refusal
from leaseq.core import moments
from leaseq.core import redact as secrets_redact
from leaseq.core.console import BULK_LIMIT, Console, JobFilter
from leaseq.core.db import Db, open_pool
from leaseq.core.errors import (
    DatabaseUnavailable,
    InvalidJob,
    LeaseqError,
    PermissionDenied,
    StatementTimeout,
)
from leaseq.core.models import JobStatus

log = logging.getLogger("leaseq.console")

#: (job_type, field, value) -> what the page may show. ``field`` is payload, result,
#: checkpoint or progress.
Redactor = Callable[[str, str, Any], Any]
#: Lists the operator's WorkerPools: (pools, None), or (None, why they cannot be read).
PoolsSource = Callable[[], tuple[list[Mapping[str, Any]] | None, str | None]]

CSRF_COOKIE = "leaseq_console_csrf"
_SECRET_KEY = re.compile(r"pass|secret|token|key|auth|credential|cookie|session|private", re.I)
MASK = "***"
TEMPLATES = Path(__file__).parent / "templates"


def default_redactor(job_type: str, field: str, value: Any) -> Any:
    """Masks the value of every key that looks like a secret (password, token, api_key, ...),
    at any depth. Register your own with ``create_app(redact=...)`` to show less."""
    if isinstance(value, Mapping):
        return {
            k: MASK if _SECRET_KEY.search(str(k)) else default_redactor(job_type, field, v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [default_redactor(job_type, field, v) for v in value]
    if isinstance(value, str):
        return secrets_redact.redact(value)
    return value


@dataclass(frozen=True)
class Panel:
    """An extra overview panel (the place later features plug in): a title, a Jinja template
    (autoescaped) and a loader that reads what it shows through the console face."""

    title: str
    template: str
    load: Callable[[Console], Mapping[str, Any]]


def kube_pools(namespace: str | None = None) -> PoolsSource:
    """WorkerPools read with the Kubernetes client, if installed and allowed."""

    def read() -> tuple[list[Mapping[str, Any]] | None, str | None]:
        try:
            import kubernetes
        except ImportError:
            return None, "the kubernetes client is not installed (pip install 'leaseq[operator]')"
        try:
            kube: Any = kubernetes
            try:
                kube.config.load_incluster_config()
            except kube.config.ConfigException:
                kube.config.load_kube_config()
            api = kube.client.CustomObjectsApi()
            if namespace:
                found = api.list_namespaced_custom_object(
                    "leaseq.dev", "v1", namespace, "workerpools", _request_timeout=3
                )
            else:
                found = api.list_cluster_custom_object(
                    "leaseq.dev", "v1", "workerpools", _request_timeout=3
                )
        except Exception as exc:  # any failure: the page says so and the rest works
            return None, f"cannot read WorkerPools: {type(exc).__name__}"
        return list(found.get("items", [])), None

    return read


def _age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    s = float(seconds)
    endless = moments.seconds_label(s)
    if endless is not None:
        return endless
    if s < 0:
        return f"in {_age(-s)}"
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}min"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _when(value: Any) -> str:
    if value is None:
        return "-"
    return moments.label(value) or value.strftime("%Y-%m-%d %H:%M:%S")


def _text(value: Any) -> str:
    return "" if value is None else secrets_redact.redact(str(value))


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _privilege(text: str) -> str:
    """The database's words in a PermissionDenied message ("permission denied for ...")."""
    found = re.search(r"lacks a privilege \((.*?)\);", text)
    return found.group(1) if found else "permission denied"


def _blank(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


def _datetime(name: str, value: str | None) -> datetime | None:
    text = _blank(value)
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidJob(name, "not a time (write 2026-12-01T14:00 or 2026-12-01)") from None


def _int(name: str, value: str | None) -> int | None:
    text = _blank(value)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidJob(name, "not a whole number") from None


class _Forbidden(Exception):
    """A form post refused before it did anything (its CSRF token)."""


class _Guard(BaseHTTPMiddleware):
    """Authenticates every request but /healthz, then, on a POST, checks its Origin (the
    endpoint checks the CSRF token when it reads the form)."""

    def __init__(self, app: Any, auth: Auth, origins: Sequence[str], render: Any) -> None:
        super().__init__(app)
        self._auth = auth
        self._origins = {o.rstrip("/") for o in origins}
        self._render = render

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.url.path.endswith("/healthz"):
            return await call_next(request)
        client = request.client.host if request.client else None
        who = self._auth.identify(client, request.headers)
        if isinstance(who, Refusal):
            log.info("console request refused", extra={"status": who.status})
            refused: Response = self._render(
                request,
                "error.html",
                {"title": "Not allowed", "message": who.message},
                who.status,
                who.headers,
            )
            return refused
        request.state.actor = who
        if request.method == "POST":
            refusal = await self._check_post(request)
            if refusal:
                log.warning("console form post refused: %s", refusal, extra={"actor": who})
                bad: Response = self._render(
                    request, "error.html", {"title": "Form refused", "message": refusal}, 403
                )
                return bad
        return await call_next(request)

    async def _check_post(self, request: Request) -> str | None:
        origin = request.headers.get("origin")
        if not origin:
            referer = request.headers.get("referer")
            if referer:
                parts = urlsplit(referer)
                origin = f"{parts.scheme}://{parts.netloc}"
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if not origin or origin == "null" or origin.rstrip("/") not in {own, *self._origins}:
            return "the form came from another site (its Origin is not this console's)"
        return None


def create_app(
    db: Db | str,
    *,
    auth: Auth | None = None,
    redact: Redactor | None = None,
    timeout: float = 5.0,
    refresh_seconds: float = 5.0,
    allowed_origins: Sequence[str] = (),
    pools: PoolsSource | None = None,
    panels: Sequence[Panel] = (),
    secure_cookies: bool = False,
) -> Starlette:
    """The console as an ASGI app, to serve alone (``leaseq console``) or mount in yours
    (``Mount("/leaseq", app=create_app(...))``).

    ``db``: a pool, a connection or a URL (a small pool is opened on it). ``auth``: the
    authentication mode (default :class:`LocalOnly`). ``redact``: what a page may show of a
    payload, result, checkpoint or progress (default :func:`default_redactor`). ``timeout``:
    every statement's bound in seconds. ``allowed_origins``: origins form posts may come from
    besides the console's own (behind a TLS-terminating ingress: ``https://console.example``).
    ``pools``: where WorkerPools are read (default: the Kubernetes API, when reachable).
    ``panels``: extra overview panels."""
    owned_pool = None
    if isinstance(db, str):
        owned_pool = open_pool(db, min_size=1, max_size=4, name="leaseq-console")
        db = owned_pool
    console = Console(db, timeout=timeout)
    guard_auth = auth or LocalOnly()
    hide = redact or default_redactor
    read_pools = pools or kube_pools()
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html"], default_for_string=True),
    )
    env.filters.update(age=_age, when=_when, text=_text, json=_json)

    def shown(job_type: str, field: str, value: Any) -> str:
        if value is None:
            return ""
        try:
            return _json(hide(job_type, field, value))
        except Exception:
            log.exception("the console's redaction hook failed; the value is hidden")
            return "(hidden: the redaction hook failed)"

    env.globals["shown"] = shown

    def render(
        request: Request,
        template: str,
        context: Mapping[str, Any],
        status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> HTMLResponse:
        token = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        root = request.scope.get("root_path", "")
        page = env.get_template(template).render(
            {
                "request": request,
                "root": root,
                "csrf": token,
                "actor": getattr(request.state, "actor", None),
                "refresh": 0,
                **context,
            }
        )
        response = HTMLResponse(page, status, headers=dict(headers or {}))
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
            "frame-ancestors 'none'; form-action 'self'"
        )
        response.headers["Referrer-Policy"] = "same-origin"
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                samesite="strict",
                secure=secure_cookies,
                path=root or "/",
            )
        return response

    def role_context() -> dict[str, Any]:
        return {"role": console.role()}

    def overview(request: Request) -> Response:
        extra = []
        for panel in panels:
            try:
                body = env.from_string(panel.template).render(panel.load(console))
            except LeaseqError as exc:
                body = f"unavailable: {_text(exc)}"
            extra.append((panel.title, body))
        return render(
            request,
            "overview.html",
            {
                **role_context(),
                "queues": console.overview(),
                "panels": extra,
                "refresh": refresh_seconds,
            },
        )

    def jobs(request: Request) -> Response:
        q = request.query_params
        status = _blank(q.get("status"))
        if status is not None and status not in {str(s) for s in JobStatus}:
            raise InvalidJob("status", f"{status!r} is not a job status")
        filters = JobFilter(
            status=None if status is None else JobStatus(status),
            queue=_blank(q.get("queue")),
            job_type=_blank(q.get("job_type")),
            error_code=_blank(q.get("error_code")),
            key=_blank(q.get("key")),
            created_from=_datetime("from", q.get("from")),
            created_to=_datetime("to", q.get("to")),
        )
        page = console.jobs(filters, before=_int("before", q.get("before")))
        kept = {k: v for k, v in q.items() if k != "before" and v}
        older = None
        if page.next_before is not None:
            older = "?" + urlencode({**kept, "before": page.next_before})
        return render(
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

    def job(request: Request) -> Response:
        job_id = int(request.path_params["job_id"])
        row, timeline = console.job(job_id)
        if row is None:
            return render(
                request,
                "error.html",
                {"title": "No such job", "message": f"job {job_id} is not in this database"},
                404,
            )
        q = request.query_params
        links = console.job_links(
            job_id,
            parents_after=_int("parents_after", q.get("parents_after")) or 0,
            children_after=_int("children_after", q.get("children_after")) or 0,
        )
        return render(
            request,
            "job.html",
            {**role_context(), "job": row, "timeline": timeline, "links": links},
        )

    def pipelines(request: Request) -> Response:
        q = request.query_params
        unfinished = _blank(q.get("unfinished")) is not None
        rows, older = console.pipelines(
            before=_int("before", q.get("before")), unfinished=unfinished
        )
        older_href = None
        if older is not None:
            older_href = "?" + urlencode(
                {"before": older, **({"unfinished": "1"} if unfinished else {})}
            )
        return render(
            request,
            "pipelines.html",
            {"rows": rows, "older": older_href, "unfinished": unfinished},
        )

    def flow(request: Request) -> Response:
        q = request.query_params
        queue = _blank(q.get("queue"))

        def cursor(prefix: str) -> tuple[str, str] | None:
            after_queue = q.get(prefix + "q")
            return None if after_queue is None else (after_queue, q.get(prefix + "k", ""))

        page = console.flow(
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

        return render(
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

    def pipeline(request: Request) -> Response:
        pipeline_id = int(request.path_params["pipeline_id"])
        row, jobs = console.pipeline(
            pipeline_id, after=_int("after", request.query_params.get("after")) or 0
        )
        if row is None:
            return render(
                request,
                "error.html",
                {"title": "No such pipeline", "message": f"pipeline {pipeline_id} is not here"},
                404,
            )
        return render(request, "pipeline.html", {**role_context(), "pipeline": row, "jobs": jobs})

    async def pipeline_cancel(request: Request) -> Response:
        pipeline_id = int(request.path_params["pipeline_id"])
        form = await form_of(request)
        actor = request.state.actor
        cancelled, running = console.cancel_pipeline(
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
        return render(
            request,
            "pipeline_cancelled.html",
            {"pipeline_id": pipeline_id, "cancelled": cancelled, "running": running},
        )

    def dead_filters(source: Mapping[str, Any]) -> dict[str, str | None]:
        return {
            "queue": _blank(source.get("queue")),
            "job_type": _blank(source.get("job_type")),
            "error_code": _blank(source.get("error_code")),
        }

    def dead(request: Request) -> Response:
        filters = dead_filters(request.query_params)
        rows, selection = console.dead(
            queue=filters["queue"], job_type=filters["job_type"], error_code=filters["error_code"]
        )
        return render(
            request,
            "dead.html",
            {
                **role_context(),
                "rows": rows,
                "selection": selection,
                "filters": filters,
                "limit": BULK_LIMIT,
            },
        )

    async def form_of(request: Request) -> dict[str, str]:
        """The posted form, once its CSRF token matched the cookie's (the Origin was checked
        before the request got here)."""
        form = await request.form()
        cookie = request.cookies.get(CSRF_COOKIE, "")
        sent = form.get("csrf")
        if not cookie or not isinstance(sent, str) or not secrets.compare_digest(cookie, sent):
            raise _Forbidden(
                "the form's CSRF token is missing or stale: reload the page and try again"
            )
        return {k: v for k, v in form.items() if isinstance(v, str)}

    def acted(request: Request, action: str, asked: int, done: list[int], back: str) -> Response:
        log.info(
            "console action",
            extra={"actor": request.state.actor, "action": action, "jobs": len(done)},
        )
        return render(
            request,
            "done.html",
            {"action": action, "asked": asked, "done": done, "back": back},
        )

    async def dead_retry(request: Request) -> Response:
        form = await form_of(request)
        filters = dead_filters(form)
        selection = console.select_dead(
            queue=filters["queue"], job_type=filters["job_type"], error_code=filters["error_code"]
        )
        done = console.retry_dead(
            selection.ids,
            actor=request.state.actor,
            reason=form.get("reason", ""),
            filter={k: v for k, v in filters.items() if v is not None},
        )
        back = "dead?" + urlencode({k: v for k, v in filters.items() if v})
        return acted(request, "retried", len(selection.ids), done, back)

    def cancel_preview(request: Request) -> Response:
        q = request.query_params
        queue, job_type = _blank(q.get("queue")), _blank(q.get("job_type"))
        selection = console.select_pending(queue=queue or "", job_type=job_type)
        return render(
            request,
            "cancel.html",
            {
                **role_context(),
                "queue": queue,
                "job_type": job_type,
                "selection": selection,
                "limit": BULK_LIMIT,
            },
        )

    async def cancel_pending(request: Request) -> Response:
        form = await form_of(request)
        queue, job_type = _blank(form.get("queue")), _blank(form.get("job_type"))
        selection = console.select_pending(queue=queue or "", job_type=job_type)
        done = console.cancel(
            selection.ids,
            actor=request.state.actor,
            reason=form.get("reason", ""),
            filter={"queue": queue, "job_type": job_type, "status": "pending"},
        )
        back = "jobs?" + urlencode({"queue": queue or "", "status": "pending"})
        return acted(request, "cancelled", len(selection.ids), done, back)

    async def job_action(request: Request) -> Response:
        job_id = int(request.path_params["job_id"])
        action = request.path_params["action"]
        form = await form_of(request)
        reason, actor = form.get("reason", ""), request.state.actor
        if action == "retry":
            done = console.retry_dead([job_id], actor=actor, reason=reason)
            return acted(request, "retried", 1, done, f"jobs/{job_id}")
        if action == "cancel":
            done = console.cancel([job_id], actor=actor, reason=reason)
            return acted(request, "cancelled", 1, done, f"jobs/{job_id}")
        return render(request, "error.html", {"title": "No such action", "message": action}, 404)

    def workers(request: Request) -> Response:
        return render(
            request,
            "workers.html",
            {"workers": console.workers(), "refresh": refresh_seconds},
        )

    def worker_pools(request: Request) -> Response:
        found, why = read_pools()
        return render(request, "pools.html", {"pools": found, "why": why})

    def schedules(request: Request) -> Response:
        return render(request, "schedules.html", {"schedules": console.schedules()})

    def audit(request: Request) -> Response:
        return render(request, "audit.html", {"rows": console.audit()})

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    def failed(request: Request, exc: Exception) -> Response:
        if isinstance(exc, _Forbidden):
            log.warning("console form post refused: %s", exc)
            return render(
                request, "error.html", {"title": "Form refused", "message": str(exc)}, 403
            )
        if isinstance(exc, PermissionDenied):
            title, status = "Refused by the database", 403
            message = (
                "the console's database role may not do this: a read-only console's role has "
                "no admin grants (leaseq migrate --console-role ROLE --console-admin false). "
                "Ask for an admin console, or use `leaseq retry` / `leaseq cancel` with a role "
                f"that may. The database said: {_privilege(_text(exc))}."
            )
        elif isinstance(exc, StatementTimeout):
            title, status = "Too slow", 503
            message = f"the database did not answer within {timeout:g} s; try again"
        elif isinstance(exc, DatabaseUnavailable):
            title, status = "Database unavailable", 503
            message = _text(exc)
        elif isinstance(exc, LeaseqError):
            title, status, message = "Cannot do that", 400, _text(exc)
        else:
            log.error("console page failed: %s", type(exc).__name__)
            title, status = "Internal error", 500
            message = "the console failed on this page; its log says more"
        if not isinstance(exc, PermissionDenied | InvalidJob):
            log.warning("console: %s: %s", title, _text(exc))
        return render(request, "error.html", {"title": title, "message": message}, status)

    def go_overview(request: Request) -> Response:
        return RedirectResponse(request.scope.get("root_path", "") + "/")

    routes = [
        Route("/", overview),
        Route("/overview", go_overview),
        Route("/jobs", jobs),
        Route("/jobs/{job_id:int}", job),
        Route("/jobs/{job_id:int}/{action:str}", job_action, methods=["POST"]),
        Route("/dead", dead),
        Route("/dead/retry", dead_retry, methods=["POST"]),
        Route("/cancel", cancel_preview),
        Route("/cancel", cancel_pending, methods=["POST"]),
        Route("/pipelines", pipelines),
        Route("/pipelines/{pipeline_id:int}", pipeline),
        Route("/pipelines/{pipeline_id:int}/cancel", pipeline_cancel, methods=["POST"]),
        Route("/flow", flow),
        Route("/workers", workers),
        Route("/pools", worker_pools),
        Route("/schedules", schedules),
        Route("/audit", audit),
        Route("/healthz", healthz),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owned_pool is not None:
                owned_pool.close()

    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(_Guard, auth=guard_auth, origins=list(allowed_origins), render=render)
        ],
        exception_handlers={Exception: failed, LeaseqError: failed, _Forbidden: failed},
        lifespan=lifespan,
    )
    app.state.console = console
    return app
