"""Pages rendered from the templates: the Jinja environment and its filters, what a page may
show of a job's values (the redaction hook), and the headers and CSRF cookie every page
carries. Error texts and tracebacks reach a page through :func:`leaseq.core.redact.redact`.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from leaseq.core import moments
from leaseq.core import redact as secrets_redact

log = logging.getLogger("leaseq.console")

#: (job_type, field, value) -> what the page may show. ``field`` is payload, result,
#: checkpoint, progress or step (a durable step's result).
Redactor = Callable[[str, str, Any], Any]

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


def age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    s = float(seconds)
    endless = moments.seconds_label(s)
    if endless is not None:
        return endless
    if s < 0:
        return f"in {age(-s)}"
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}min"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def when(value: Any) -> str:
    if value is None:
        return "-"
    return moments.label(value) or value.strftime("%Y-%m-%d %H:%M:%S")


def text(value: Any) -> str:
    """``value`` as text a page may show: redacted (a password in a URL, a token)."""
    return "" if value is None else secrets_redact.redact(str(value))


def quoted(value: Any) -> str:
    """``value`` as one word of a shell command a page shows (a step name with a space)."""
    return shlex.quote(str(value))


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


class Renderer:
    """Renders a template into a page that is never cached or framed, and sets the CSRF
    cookie (a random token the page's forms repeat) on a browser that has none yet: Secure
    when the request came over https, or always with ``secure_cookies``."""

    def __init__(self, redact: Redactor, *, secure_cookies: bool) -> None:
        self._redact = redact
        self._secure_cookies = secure_cookies
        self._env = Environment(
            loader=FileSystemLoader(str(TEMPLATES)),
            autoescape=select_autoescape(["html"], default_for_string=True),
        )
        self._env.filters.update(age=age, when=when, text=text, json=as_json, quoted=quoted)
        self._env.globals["shown"] = self._shown

    def _shown(self, job_type: str, field: str, value: Any) -> str:
        if value is None:
            return ""
        try:
            return as_json(self._redact(job_type, field, value))
        except Exception:
            log.exception("the console's redaction hook failed; the value is hidden")
            return "(hidden: the redaction hook failed)"

    def fragment(self, template: str, values: Mapping[str, Any]) -> str:
        """``template`` (a string, autoescaped) rendered with ``values``: a panel's body."""
        return self._env.from_string(template).render(values)

    def __call__(
        self,
        request: Request,
        template: str,
        context: Mapping[str, Any],
        status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> HTMLResponse:
        token = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        root = request.scope.get("root_path", "")
        page = self._env.get_template(template).render(
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
                # Behind a TLS-terminating proxy the request itself is plain http.
                secure=self._secure_cookies or request.url.scheme == "https",
                path=root or "/",
            )
        return response
