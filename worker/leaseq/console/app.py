"""The console's ASGI application: server-rendered pages over :class:`leaseq.core.console.Console`.

Every page is one short, bounded transaction (sql/queries/console.sql). Form posts check the
Origin and a CSRF token (:mod:`leaseq.console.guard`). Payloads, results, checkpoints and
progress reach a page only through the redaction hook; error texts and tracebacks through
:func:`leaseq.core.redact.redact` (:mod:`leaseq.console.rendering`). Errors render as a page
saying what happened, never a traceback (:mod:`leaseq.console.failures`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from leaseq.console.actions import Actions
from leaseq.console.auth import Auth, LocalOnly
from leaseq.console.failures import ErrorPages
from leaseq.console.guard import Forbidden, Guard
from leaseq.console.pages import Pages, Panel, PoolsSource, go_overview, healthz
from leaseq.console.rendering import Redactor, Renderer, default_redactor
from leaseq.core.console import Console
from leaseq.core.db import Db, open_pool
from leaseq.core.errors import LeaseqError


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


def _routes(pages: Pages, actions: Actions) -> list[Route]:
    """Every URL of the console, in one table."""
    return [
        Route("/", pages.overview),
        Route("/overview", go_overview),
        Route("/jobs", pages.jobs),
        Route("/jobs/{job_id:int}", pages.job),
        Route("/jobs/{job_id:int}/{action:str}", actions.job, methods=["POST"]),
        Route("/jobs/{job_id:int}/steps/resolve", actions.step_resolve, methods=["POST"]),
        Route("/dead", pages.dead),
        Route("/dead/retry", actions.dead_retry, methods=["POST"]),
        Route("/cancel", pages.cancel_preview),
        Route("/cancel", actions.cancel_pending, methods=["POST"]),
        Route("/pipelines", pages.pipelines),
        Route("/pipelines/{pipeline_id:int}", pages.pipeline),
        Route("/pipelines/{pipeline_id:int}/cancel", actions.pipeline_cancel, methods=["POST"]),
        Route("/flow", pages.flow),
        Route("/workers", pages.workers),
        Route("/pools", pages.worker_pools),
        Route("/schedules", pages.schedules),
        Route("/audit", pages.audit),
        Route("/healthz", healthz),
    ]


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
    payload, result, checkpoint, progress or step result (default :func:`default_redactor`).
    ``timeout``: every statement's bound in seconds. ``allowed_origins``: origins form posts may
    come from besides the console's own (behind a TLS-terminating ingress:
    ``https://console.example``). ``pools``: where WorkerPools are read (default: the Kubernetes
    API, when reachable). ``panels``: extra overview panels. ``secure_cookies``: the CSRF cookie
    is ``Secure`` on every answer (behind a TLS-terminating proxy, where requests arrive as
    plain http); it always is on a request that came over https."""
    owned_pool = None
    if isinstance(db, str):
        owned_pool = open_pool(db, min_size=1, max_size=4, name="leaseq-console")
        db = owned_pool
    console = Console(db, timeout=timeout)
    render = Renderer(redact or default_redactor, secure_cookies=secure_cookies)
    pages = Pages(
        console,
        render,
        refresh_seconds=refresh_seconds,
        pools=pools or kube_pools(),
        panels=panels,
    )
    failed = ErrorPages(render, timeout)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owned_pool is not None:
                owned_pool.close()

    app = Starlette(
        routes=_routes(pages, Actions(console, render)),
        middleware=[
            Middleware(
                Guard, auth=auth or LocalOnly(), origins=list(allowed_origins), render=render
            )
        ],
        exception_handlers={Exception: failed, LeaseqError: failed, Forbidden: failed},
        lifespan=lifespan,
    )
    app.state.console = console
    return app
