"""What a request passes before a page sees it: authentication (every path but the exact
health path, :data:`HEALTH_PATH`), then, for a form post, its Origin (here) and its CSRF
token (:func:`form_of`, when the endpoint reads the form: a random cookie the form repeats,
double submit, SameSite=Strict)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response

from leaseq.console.auth import Auth, Refusal
from leaseq.console.rendering import CSRF_COOKIE, Renderer
from leaseq.core.errors import InvalidJob

log = logging.getLogger("leaseq.console")


#: The one path a probe opens without credentials (relative to where the console is mounted).
HEALTH_PATH = "/healthz"


def is_health_probe(scope: Mapping[str, Any]) -> bool:
    """True only for the health path itself: a path merely ending in ``/healthz``
    (``/x/healthz``, ``/jobs/1/healthz``) is authenticated like every other."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    # Starlette's Mount keeps the mount prefix in ``path`` and repeats it in ``root_path``;
    # a bare ASGI server with --root-path may strip it.
    return path in (HEALTH_PATH, root + HEALTH_PATH)


class Forbidden(Exception):
    """A form post refused before it did anything (its CSRF token)."""


class Guard(BaseHTTPMiddleware):
    """Authenticates every request but a health probe (:func:`is_health_probe`), then, on a
    POST, checks its Origin (the endpoint checks the CSRF token when it reads the form)."""

    def __init__(self, app: Any, auth: Auth, origins: Sequence[str], render: Renderer) -> None:
        super().__init__(app)
        self._auth = auth
        self._origins = {o.rstrip("/") for o in origins}
        self._render = render

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if is_health_probe(request.scope):
            return await call_next(request)
        client = request.client.host if request.client else None
        who = self._auth.identify(client, request.headers)
        if isinstance(who, Refusal):
            log.info("console request refused", extra={"status": who.status})
            return self._render(
                request,
                "error.html",
                {"title": "Not allowed", "message": who.message},
                who.status,
                who.headers,
            )
        request.state.actor = who
        if request.method == "POST":
            refusal = await self._check_post(request)
            if refusal:
                log.warning("console form post refused: %s", refusal, extra={"actor": who})
                return self._render(
                    request, "error.html", {"title": "Form refused", "message": refusal}, 403
                )
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


async def form_of(request: Request) -> dict[str, str]:
    """The posted form, once its CSRF token matched the cookie's (the Origin was checked
    before the request got here); raises :class:`Forbidden` otherwise, and InvalidJob (a
    page saying so) for a form the parser refuses, such as a field over 1 MiB."""
    try:
        form = await request.form()
    except HTTPException as exc:
        # Starlette's parser answers with a bare text response otherwise.
        raise InvalidJob("form", f"is refused: {exc.detail}") from exc
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = form.get("csrf")
    if not cookie or not isinstance(sent, str) or not secrets.compare_digest(cookie, sent):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page and try again")
    return {k: v for k, v in form.items() if isinstance(v, str)}
