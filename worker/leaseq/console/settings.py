"""``leaseq console``'s settings: flags with LEASEQ_CONSOLE_* fallbacks, checked at start-up."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from leaseq import config as settings
from leaseq.console.forwarded import TrustedProxies
from leaseq.core.errors import ConfigError

PORT = settings.Option(
    "port", "LEASEQ_CONSOLE_PORT", settings.port, 8089, "port the console listens on"
)
ADDRESS = settings.Option(
    "address",
    "LEASEQ_CONSOLE_ADDRESS",
    settings.bind_address,
    "127.0.0.1",
    "address the console listens on; anything but loopback needs --auth basic or proxy",
)
AUTH = settings.Option(
    "auth",
    "LEASEQ_CONSOLE_AUTH",
    settings.choice("none", "basic", "proxy"),
    "none",
    "none (only on a loopback address), basic (users from --basic-auth-file or "
    "LEASEQ_CONSOLE_USERNAME/LEASEQ_CONSOLE_PASSWORD) or proxy (a header from --trusted-proxy)",
)
BASIC_AUTH_FILE = settings.Option(
    "basic_auth_file",
    "LEASEQ_CONSOLE_BASIC_AUTH_FILE",
    str,
    None,
    "file of user:password lines (a mounted Secret) for --auth basic",
)
PROXY_HEADER = settings.Option(
    "proxy_header",
    "LEASEQ_CONSOLE_PROXY_HEADER",
    str,
    "X-Forwarded-User",
    "with --auth proxy: the header naming the user",
)
TRUSTED_PROXY = settings.Option(
    "trusted_proxy",
    "LEASEQ_CONSOLE_TRUSTED_PROXY",
    settings.csv_list,
    None,
    "addresses or networks (comma separated) of the proxies in front of the console, such as "
    "an Ingress controller's pods: a request from one is counted for the sign-in throttle as "
    "the client its X-Forwarded-For names; with --auth proxy, the only peers whose user header "
    "is accepted (default: none, every peer is its own client)",
)
ALLOWED_ORIGIN = settings.Option(
    "allowed_origin",
    "LEASEQ_CONSOLE_ALLOWED_ORIGIN",
    settings.csv_list,
    None,
    "origins form posts may come from besides the console's own (comma separated), e.g. "
    "https://leaseq.example.com behind a TLS ingress",
)
TIMEOUT = settings.Option(
    "statement_timeout",
    "LEASEQ_CONSOLE_STATEMENT_TIMEOUT",
    settings.duration,
    5.0,
    "bound of every console statement (e.g. 5s)",
)
REFRESH = settings.Option(
    "refresh",
    "LEASEQ_CONSOLE_REFRESH",
    settings.duration,
    5.0,
    "how often the overview and workers pages refresh while visible",
)
REDACT_HOOK = settings.Option(
    "redact_hook",
    "LEASEQ_CONSOLE_REDACT_HOOK",
    str,
    None,
    "module:function(job_type, field, value) deciding what a page shows of payloads, results, "
    "checkpoints and progress (default: mask secret-looking keys)",
)
POOLS_NAMESPACE = settings.Option(
    "pools_namespace",
    "LEASEQ_CONSOLE_POOLS_NAMESPACE",
    str,
    None,
    "namespace whose WorkerPools the WorkerPools page lists (default: every namespace the "
    "Kubernetes credentials may read)",
)
BEHIND_HTTPS = settings.Option(
    "behind_https",
    "LEASEQ_CONSOLE_BEHIND_HTTPS",
    settings.boolean,
    False,
    "true when browsers reach the console over https through a TLS-terminating proxy or "
    "Ingress: its CSRF cookie is then Secure (it always is on a request that came over https)",
)
ALLOW_PRIVILEGED_ROLE = settings.Option(
    "allow_privileged_role",
    "LEASEQ_CONSOLE_ALLOW_PRIVILEGED_ROLE",
    settings.boolean,
    False,
    "true: serve even as a superuser, a BYPASSRLS role or the owner of leaseq's tables "
    "(refused otherwise: no policy or grant would hold the console), with a warning",
)
OPTIONS = (
    settings.DATABASE_URL,
    PORT,
    ADDRESS,
    AUTH,
    BASIC_AUTH_FILE,
    PROXY_HEADER,
    TRUSTED_PROXY,
    ALLOWED_ORIGIN,
    BEHIND_HTTPS,
    TIMEOUT,
    REFRESH,
    REDACT_HOOK,
    POOLS_NAMESPACE,
    ALLOW_PRIVILEGED_ROLE,
    settings.LOG_LEVEL,
    settings.LOG_FORMAT,
)


@dataclass(frozen=True)
class ConsoleSettings:
    database_url: str
    port: int
    address: str
    auth: str
    basic_auth_file: str | None
    basic_users: Mapping[str, str]
    proxy_header: str
    trusted_proxy: tuple[str, ...]
    allowed_origin: tuple[str, ...]
    behind_https: bool
    statement_timeout: float
    refresh: float
    redact_hook: str | None
    pools_namespace: str | None
    allow_privileged_role: bool
    log_level: str
    log_format: str

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> ConsoleSettings:
        env = os.environ if environ is None else environ
        v = settings.resolve(args, OPTIONS, env)
        url = settings.require(v, settings.DATABASE_URL)
        users: dict[str, str] = {}
        if env.get("LEASEQ_CONSOLE_USERNAME") and env.get("LEASEQ_CONSOLE_PASSWORD"):
            users[env["LEASEQ_CONSOLE_USERNAME"]] = env["LEASEQ_CONSOLE_PASSWORD"]
        if v["auth"] == "none" and v["address"] not in ("127.0.0.1", "::1", "localhost"):
            raise ConfigError(
                f"--address {v['address']} is not loopback: choose --auth basic or --auth proxy "
                "(a console without authentication answers only on 127.0.0.1)"
            )
        if v["auth"] == "basic" and not (users or v["basic_auth_file"]):
            raise ConfigError(
                "--auth basic needs --basic-auth-file (or LEASEQ_CONSOLE_USERNAME and "
                "LEASEQ_CONSOLE_PASSWORD)"
            )
        if v["auth"] == "proxy" and not v["trusted_proxy"]:
            raise ConfigError("--auth proxy needs --trusted-proxy (the proxy's addresses)")
        TrustedProxies(v["trusted_proxy"] or ())  # an entry that is no address is refused now
        return cls(
            database_url=url,
            port=v["port"],
            address=v["address"],
            auth=v["auth"],
            basic_auth_file=v["basic_auth_file"],
            basic_users=users,
            proxy_header=v["proxy_header"],
            trusted_proxy=tuple(v["trusted_proxy"] or ()),
            allowed_origin=tuple(v["allowed_origin"] or ()),
            behind_https=v["behind_https"],
            statement_timeout=v["statement_timeout"],
            refresh=v["refresh"],
            redact_hook=v["redact_hook"],
            pools_namespace=v["pools_namespace"],
            allow_privileged_role=v["allow_privileged_role"],
            log_level=v["log_level"],
            log_format=v["log_format"],
        )
