"""The one redaction point for database URLs and conninfo strings.

Every path that can show text derived from a connection string goes through here: error
messages (:func:`leaseq.core.errors.translate` and the CLI's error printer), every log line (the
formatters in :mod:`leaseq.runtime.logs` redact the finished line, traceback included), uncaught
exceptions in any thread (:func:`install_hooks`), psycopg_pool's warnings (they are log
lines) and the probes (which never echo database text at all).

Two mechanisms, both applied to every string:

1. **Known secrets.** Each process :func:`remember`\\ s the connection strings it was given;
   whatever part of one could be a password (parsed leniently, so a malformed URL's password
   is found too) is replaced wherever it appears, whatever quotes it back.
2. **Shapes.** ``scheme://user:PASSWORD@``, ``user:PASSWORD@host`` and ``password=VALUE``
   are masked even for strings this process never saw (a URL inside a library's message).

Over-redacting is accepted; printing a password is not.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import traceback
from types import TracebackType
from urllib.parse import unquote

MASK = "***"

# scheme://user:password@ (greedy to the last '@' on the line: a password may contain '@').
# The head starts only where a run of scheme characters starts: a start inside the run would
# rescan it, and a 5 MB word in an error message then takes minutes (quadratic).
_URL_USERINFO = re.compile(
    r"(?P<head>(?<![A-Za-z0-9+.-])[A-Za-z0-9+.-]+:/+[^:/@\s]*:)(?P<secret>[^\n]*)@"
)
# user:password@host with no scheme (what a URL missing its scheme looks like).
_BARE_USERINFO = re.compile(r"(?P<head>(?<![\w/:])[\w.%-]+:)(?P<secret>[^\s@/]+)@(?=[\w\[.-])")
# password=value in conninfo, quoted ('...' with \' escapes) or up to the next space.
_KEYWORD = re.compile(
    r"(?P<head>\b(?:password|passwd|pgpassword|sslpassword)\s*=\s*)"
    r"(?P<secret>'(?:[^'\\]|\\.)*'?|[^\s'\"]+)",
    re.IGNORECASE,
)

_known: set[str] = set()
_lock = threading.Lock()

# Secrets shorter than this are masked by shape only: replacing every "a" or "12" in every
# message would make them unreadable, and such a password is no secret anyway.
_MIN_KNOWN = 4


def candidate_secrets(conninfo: str) -> set[str]:
    """Every substring of ``conninfo`` that may be a password, for any shape of string
    (URL with or without a valid scheme, conninfo keywords, malformed ones too)."""
    found: set[str] = set()
    for pattern in (_URL_USERINFO, _BARE_USERINFO, _KEYWORD):
        for match in pattern.finditer(conninfo):
            secret = match.group("secret")
            found.add(secret)
            found.add(secret.strip("'"))
            found.add(unquote(secret))
    return {s for s in found if len(s) >= _MIN_KNOWN}


def remember(conninfo: str | None) -> None:
    """Register the secrets of a connection string this process uses, so that they are
    masked wherever they appear later, whatever quoted them."""
    if not conninfo:
        return
    secrets = candidate_secrets(conninfo)
    with _lock:
        _known.update(secrets)


def redact(text: str) -> str:
    """``text`` with every known secret and every password-shaped substring masked."""
    if not text:
        return text
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('head')}{MASK}@", text)
    text = _BARE_USERINFO.sub(lambda m: f"{m.group('head')}{MASK}@", text)
    return _KEYWORD.sub(lambda m: f"{m.group('head')}{MASK}", text)


def format_exception(exc: BaseException) -> str:
    """A traceback, chained causes included, with secrets masked."""
    return redact("".join(traceback.format_exception(exc)))


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write(redact(text))


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    sys.stderr.write(redact(f"Exception in thread {name}:\n{text}"))


def install_hooks() -> None:
    """Mask secrets in uncaught exceptions' tracebacks, in the main thread and every other."""
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook


_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):/")


def malformed(conninfo: str) -> str:
    """Why ``conninfo`` cannot be parsed, in words that quote none of it but the scheme.

    Used instead of libpq's own parse error, which echoes the string (or a fragment of the
    password) back."""
    scheme = _SCHEME.match(conninfo)
    if scheme and scheme.group(1).lower() not in ("postgresql", "postgres"):
        return f"its scheme is {scheme.group(1)!r}; a database URL starts with postgresql://"
    if scheme:
        if any(c.isspace() for c in conninfo.strip()):
            return "the URL contains a space; percent-encode spaces in it as %20"
        return "the URL is malformed; check it against postgresql://user:password@host:port/db"
    if "=" not in conninfo:
        return (
            "it is neither a postgresql:// URL nor key=value conninfo "
            "(is the postgresql:// scheme missing?)"
        )
    return "the key=value conninfo is malformed; quote values with spaces in single quotes"


class RedactingFilter(logging.Filter):
    """Masks secrets in a record before any formatter sees it: the message (arguments
    merged in), the traceback and the stack. Set on handlers, so records propagated from
    any library's logger (psycopg_pool's warnings, kopf's) pass through it too."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            # Formatters use exc_text when exc_info is gone; none may format it again raw.
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def redact_logs() -> None:
    """Put :class:`RedactingFilter` on every handler of the root logger (call after the
    handlers are set up; calling again adds nothing twice)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
