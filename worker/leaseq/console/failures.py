"""An error on any page renders as a page saying what happened and what to do, never a
traceback: a refused form, a privilege the console's role lacks, a slow or unreachable
database, a bad field; anything else is a 500 whose details go only to the log."""

from __future__ import annotations

import logging
import re

from starlette.requests import Request
from starlette.responses import Response

from leaseq.console.guard import Forbidden
from leaseq.console.rendering import Renderer, text
from leaseq.core.errors import (
    DatabaseUnavailable,
    InvalidJob,
    LeaseqError,
    PermissionDenied,
    StatementTimeout,
)

log = logging.getLogger("leaseq.console")


def _privilege(message: str) -> str:
    """The database's words in a PermissionDenied message ("permission denied for ...")."""
    found = re.search(r"lacks a privilege \((.*?)\);", message)
    return found.group(1) if found else "permission denied"


class ErrorPages:
    """The app's exception handler; ``timeout`` is the statement bound a slow page names."""

    def __init__(self, render: Renderer, timeout: float) -> None:
        self.render = render
        self.timeout = timeout

    def __call__(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, Forbidden):
            log.warning("console form post refused: %s", exc)
            return self.render(
                request, "error.html", {"title": "Form refused", "message": str(exc)}, 403
            )
        if isinstance(exc, PermissionDenied):
            title, status = "Refused by the database", 403
            message = (
                "the console's database role may not do this: a read-only console's role has "
                "no admin grants (leaseq migrate --console-role ROLE --console-admin false). "
                "Ask for an admin console, or use `leaseq retry`, `leaseq cancel` or `leaseq "
                "steps resolve` with a role that may. The database said: "
                f"{_privilege(text(exc))}."
            )
        elif isinstance(exc, StatementTimeout):
            title, status = "Too slow", 503
            message = f"the database did not answer within {self.timeout:g} s; try again"
        elif isinstance(exc, DatabaseUnavailable):
            title, status = "Database unavailable", 503
            message = text(exc)
        elif isinstance(exc, LeaseqError):
            title, status, message = "Cannot do that", 400, text(exc)
        else:
            log.error("console page failed: %s", type(exc).__name__)
            title, status = "Internal error", 500
            message = "the console failed on this page; its log says more"
        if not isinstance(exc, PermissionDenied | InvalidJob):
            log.warning("console: %s: %s", title, text(exc))
        return self.render(request, "error.html", {"title": title, "message": message}, status)
