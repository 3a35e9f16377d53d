"""``leaseq console``: serve the web console with uvicorn (the ``console`` extra)."""

from __future__ import annotations

import argparse
import importlib
import logging
from typing import Any

from leaseq import config as settings
from leaseq.core.console import Console
from leaseq.core.db import connect
from leaseq.core.errors import ConfigError

log = logging.getLogger("leaseq.console")

HELP = "serve the web console for the people on call (needs the console extra)"


def _redactor(spec: str | None) -> Any:
    if spec is None:
        return None
    module, sep, name = spec.partition(":")
    if not sep:
        raise ConfigError(f"--redact-hook {spec!r}: write module:function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--redact-hook {spec!r}: {exc}") from None


def refuse_a_powerful_role(url: str, *, timeout: float, allow: bool) -> None:
    """Raises :class:`ConfigError` when the database role of ``url`` is a superuser, has
    BYPASSRLS or owns leaseq's tables (no policy or grant would hold the console), unless
    ``allow``: then it only logs a warning."""
    with connect(url, action="console: check role") as conn:
        power = Console(conn, timeout=timeout).power()
    if not power.reasons:
        return
    why = " and ".join(power.reasons)
    if allow:
        log.warning(
            "THE CONSOLE RUNS AS ROLE %s, WHICH %s: no row policy or grant limits what it "
            "reads or changes (--allow-privileged-role true). Give it its own role: "
            "leaseq migrate --console-role ROLE",
            power.role,
            why.upper(),
        )
        return
    raise ConfigError(
        f"the console's database role {power.role} {why}, so no row policy or grant would "
        "hold it: a bug or a stolen session could change any table. Connect it as its own "
        "role: `leaseq migrate --console-role leaseq_console` (as the owner), then "
        "`leaseq console --database-url` with that role's URL. To serve anyway, pass "
        "--allow-privileged-role true (LEASEQ_CONSOLE_ALLOW_PRIVILEGED_ROLE)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from leaseq.console.app import create_app, kube_pools
        from leaseq.console.auth import Auth, BasicAuth, LocalOnly, ProxyAuth
        from leaseq.console.settings import ConsoleSettings
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"`leaseq console` needs the console extra: pip install 'leaseq[console]' "
            f"(missing module {exc.name!r})"
        ) from exc
    from leaseq.core import redact
    from leaseq.runtime import logs

    config = ConsoleSettings.from_args(args)
    logs.configure(config.log_level, config.log_format)
    redact.remember(config.database_url)
    refuse_a_powerful_role(
        config.database_url,
        timeout=config.statement_timeout,
        allow=config.allow_privileged_role,
    )
    auth: Auth
    if config.auth == "basic":
        auth = (
            BasicAuth.from_file(config.basic_auth_file, trusted_proxies=config.trusted_proxy)
            if config.basic_auth_file
            else BasicAuth(config.basic_users, trusted_proxies=config.trusted_proxy)
        )
    elif config.auth == "proxy":
        auth = ProxyAuth(config.proxy_header, config.trusted_proxy)
    else:
        auth = LocalOnly()
    app = create_app(
        config.database_url,
        auth=auth,
        redact=_redactor(config.redact_hook),
        timeout=config.statement_timeout,
        refresh_seconds=config.refresh,
        allowed_origins=config.allowed_origin,
        secure_cookies=config.behind_https,
        pools=kube_pools(config.pools_namespace),
    )
    uvicorn.run(
        app,
        host=config.address,
        port=config.port,
        log_config=None,
        # Query strings carry only filters, but no access log is the smaller promise.
        access_log=False,
        # X-Forwarded-For is read by the authentication, only from --trusted-proxy
        # (leaseq.console.forwarded): uvicorn's would hide the peer the checks need.
        proxy_headers=False,
        server_header=False,
    )
    return 0


def add_command(sub: Any) -> None:
    from leaseq.console import settings as console_settings

    p = sub.add_parser(
        "console",
        help=HELP,
        description="Serve the web console: queues, jobs, dead jobs (bulk retry), workers, "
        "WorkerPools, schedules and the audit of every admin action. Bound to 127.0.0.1 "
        "unless told otherwise. Every flag falls back to its LEASEQ_* variable.",
    )
    settings.add_options(p, console_settings.OPTIONS)
    p.set_defaults(func=run)
