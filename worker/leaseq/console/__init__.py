"""The web console for the people on call: ``leaseq console``, or mounted in any ASGI app.

    from leaseq.console import create_app, BasicAuth
    app = create_app("postgresql://console@db/app", auth=BasicAuth({"ann": "s3cret"}))

Needs the ``console`` extra (Starlette, Jinja2, uvicorn). See docs/guides/console.md. The
names below load on first use, so ``leaseq.console.settings`` works without the extra.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Auth",
    "BasicAuth",
    "LocalOnly",
    "Panel",
    "ProxyAuth",
    "create_app",
    "default_redactor",
]

_WHERE = {
    "Auth": "leaseq.console.auth",
    "BasicAuth": "leaseq.console.auth",
    "LocalOnly": "leaseq.console.auth",
    "ProxyAuth": "leaseq.console.auth",
    "Panel": "leaseq.console.pages",
    "create_app": "leaseq.console.app",
    "default_redactor": "leaseq.console.rendering",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'leaseq.console' has no attribute {name!r}")
