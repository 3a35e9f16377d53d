"""Settings from flags with ``LEASEQ_*`` environment fallbacks, validated once at start-up.

Each process role declares its :class:`Option` list; :func:`add_options` puts them on an
argparse parser and :func:`resolve` turns parsed flags (or, when a flag is absent, the
environment) into plain values, raising :class:`leaseq.core.errors.ConfigError` naming the flag
and variable on a bad value. Roles wrap the result in a frozen dataclass and pass it on
explicitly. ``docs_table`` renders the documentation's configuration tables from the same lists.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leaseq.core.errors import ConfigError, check_conninfo

#: Set in every container of a Kubernetes pod: how leaseq tells a pod from a laptop or a VM.
POD_MARKER = "KUBERNETES_SERVICE_HOST"

#: ``Option.local_default`` when an option has one default everywhere.
SAME: Any = object()


def in_pod(environ: Mapping[str, str]) -> bool:
    """True inside a Kubernetes pod (the kubelet sets ``KUBERNETES_SERVICE_HOST``)."""
    return POD_MARKER in environ


@dataclass(frozen=True)
class Option:
    """One setting: ``--flag``, its ``LEASEQ_*`` variable, parser, default and help text.
    ``local_default``, when given, is the default outside a Kubernetes pod (:func:`in_pod`)."""

    name: str
    env: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    repeat: bool = False
    #: Never echo the value in an error (it may hold a password).
    secret: bool = False
    local_default: Any = SAME
    #: How the default is shown when it is derived from other settings (``default`` is then
    #: None and the settings fill it in).
    default_shown: str | None = None

    def default_in(self, environ: Mapping[str, str]) -> Any:
        """The default where this process runs: in a pod, or not."""
        if self.local_default is SAME or in_pod(environ):
            return self.default
        return self.local_default

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be greater than zero")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-z]*)$")
#: Units a duration may carry. No bare ``m``: it reads as minutes to some and months to
#: others (a prune of ``1m`` once deleted everything a minute old).
DURATION_UNITS = {
    "": 1,
    "s": 1,
    "sec": 1,
    "min": 60,
    "h": 3600,
    "d": 86400,
    "w": 604800,
}


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30min``, ``12h``, ``7d`` or ``2w``; ``m``/``M`` are
    refused with a message saying what to write instead."""
    cleaned = text.strip()
    match = _DURATION.match(cleaned)
    if (match and match.group(2) in ("m", "mo", "mon")) or re.fullmatch(r"[\d.]+\s*M", cleaned):
        raise ValueError(
            f"{text!r} is ambiguous (minutes or months?): write minutes as 'min' (e.g. 30min) "
            "and longer spans in d or w (e.g. 30d)"
        )
    if not match or match.group(2).lower() not in DURATION_UNITS:
        raise ValueError(
            f"{text!r} is not a duration: a number with s, min, h, d or w (e.g. 90s, 30min, "
            "12h, 7d, 2w; a bare number is seconds)"
        )
    return float(match.group(1)) * DURATION_UNITS[match.group(2)]


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number in [0, 65535] (0 disables)")
    return value


def csv_list(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("must list at least one name")
    return items


def database_url(text: str) -> str:
    """A connection string libpq can parse; its password is masked from then on."""
    try:
        return check_conninfo(text, action="configure")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def bind_address(text: str) -> str:
    """An IP address to listen on (0.0.0.0 or :: for every interface), or localhost."""
    if text == "localhost":
        return text
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError("must be an IP address such as 0.0.0.0, 127.0.0.1 or ::") from None


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return parse


DATABASE_URL = Option(
    "database_url",
    "LEASEQ_DATABASE_URL",
    database_url,
    None,
    "PostgreSQL URL, e.g. postgresql://user:pass@host:5432/db",
    secret=True,
)
# In a pod the endpoints are for Prometheus and the kubelet: every interface, a known port.
# Elsewhere (a laptop, a VM) they stay on loopback, on a port the system picks, so a second
# process on one machine starts without flags; the address served is logged.
METRICS_PORT = Option(
    "metrics_port",
    "LEASEQ_METRICS_PORT",
    port,
    9100,
    "HTTP port for /metrics (a worker also serves /healthz and /readyz there); 0 disables; "
    "outside a Kubernetes pod the default (None) is a free port, logged at start-up",
    local_default=None,
)
METRICS_ADDRESS = Option(
    "metrics_address",
    "LEASEQ_METRICS_ADDRESS",
    bind_address,
    "0.0.0.0",  # noqa: S104 - a pod's port: reachable from Prometheus unless told otherwise
    "address the HTTP endpoints (metrics, probes) listen on; 127.0.0.1 keeps them local; "
    "outside a Kubernetes pod the default is 127.0.0.1",
    local_default="127.0.0.1",
)


def bind_port(port: int | None) -> int:
    """The port to bind for a resolved ``--metrics-port``: None (no port chosen, outside a
    pod) asks the system for a free one."""
    return 0 if port is None else port


def role_name(text: str) -> str:
    """A PostgreSQL role name (1-63 characters; quoted by the database, never by leaseq)."""
    if not 1 <= len(text) <= 63 or any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError("must be a role name of 1-63 characters without spaces")
    return text


WORKER_ROLE, OPERATOR_ROLE, PRODUCER_ROLE = (
    Option(
        f"{component}_role",
        f"LEASEQ_{component.upper()}_ROLE",
        role_name,
        None,
        f"database role the {component}s run as: `leaseq migrate` grants it exactly the "
        f"{component}'s privileges (docs/guides/security.md); unset: no grants for {component}s",
    )
    for component in ("worker", "operator", "producer")
)
GRANT_OPTIONS = (WORKER_ROLE, OPERATOR_ROLE, PRODUCER_ROLE)


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError("must be true or false")
    return lowered == "true"


CONSOLE_ROLE = Option(
    "console_role",
    "LEASEQ_CONSOLE_ROLE",
    role_name,
    None,
    "database role `leaseq console` runs as: `leaseq migrate` grants it read access and, "
    "unless --console-admin false, only the console's audited retry and cancel "
    "(docs/guides/console.md); unset: no console grants",
)
CONSOLE_ADMIN = Option(
    "console_admin",
    "LEASEQ_CONSOLE_ADMIN",
    boolean,
    True,
    "with --console-role: true grants the console its admin actions (retry dead jobs, cancel "
    "jobs, each audited), false makes it read-only",
)
CONSOLE_REPLACE = Option(
    "console_replace",
    "LEASEQ_CONSOLE_REPLACE",
    boolean,
    False,
    "with --console-role: true lets that role replace a different console role already "
    "registered (one console role at a time: the previous one's privileges are revoked); "
    "false refuses the switch",
)
CONSOLE_GRANT_OPTIONS = (CONSOLE_ROLE, CONSOLE_ADMIN, CONSOLE_REPLACE)

HOT_RETENTION = Option(
    "hot_retention",
    "LEASEQ_HOT_RETENTION",
    duration,
    3600.0,
    "how long a finished job stays in leaseq.jobs before the leader moves it to history"
    " (e.g. 30min, 1h, 2d; keep it at least a WorkerPool's work.windowSeconds, whose run"
    " times are read from the hot table)",
)
LOG_LEVEL = Option(
    "log_level",
    "LEASEQ_LOG_LEVEL",
    choice("DEBUG", "INFO", "WARNING", "ERROR"),
    "INFO",
    "log level",
)
LOG_FORMAT = Option(
    "log_format",
    "LEASEQ_LOG_FORMAT",
    choice("json", "text"),
    "text",
    "log line format: json (one object per line) or text",
)


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Add each option as a flag; defaults stay None so the environment can fill them in."""
    for option in options:
        parser.add_argument(
            option.flag,
            dest=option.name,
            action="append" if option.repeat else "store",
            default=None,
            help=f"{option.help} (env {option.env}; default {_shown_default(option)})",
        )


def resolve(
    args: argparse.Namespace,
    options: Sequence[Option],
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Flag value, else environment variable, else default; each parsed and checked."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for option in options:
        raw = getattr(args, option.name, None)
        source = option.flag
        if raw is None and option.env in env:
            raw, source = env[option.env], option.env
        if raw is None:
            values[option.name] = option.default_in(env)
            continue
        if option.repeat and isinstance(raw, list):
            raw = ",".join(raw)
        try:
            values[option.name] = option.parse(raw)
        except ValueError as exc:
            shown = source if option.secret else f"{source}={raw!r}"
            raise ConfigError(f"{shown}: {exc}") from None
    return values


def require(values: Mapping[str, Any], option: Option) -> Any:
    """The option's value, or a ConfigError saying how to set it."""
    value = values.get(option.name)
    if value is None:
        raise ConfigError(f"{option.flag} is required (or set {option.env})")
    return value


def _shown_default(option: Option) -> str:
    return repr(option.default) if option.default_shown is None else option.default_shown


def docs_table(options: Sequence[Option]) -> str:
    """A markdown table of the options, for docs/reference/configuration.md."""
    lines = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for option in options:
        default = f"`{option.default!r}`" if option.default_shown is None else option.default_shown
        if option.local_default is not SAME:
            default += f" in a pod, else `{option.local_default!r}`"
        lines.append(f"| `{option.flag}` | `{option.env}` | {default} | {option.help} |")
    return "\n".join(lines)
