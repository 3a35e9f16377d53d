"""Structured log lines: JSON objects or ``key=value`` text, with leaseq's context fields.

Queue and worker code log with ``extra={"job_id": ..., "queue": ..., "worker": ...,
"attempt": ..., "token": ...}``; the formatters here put those fields in every line that has
them, so one job can be followed across workers with a single filter.

Every line is bounded: a message or traceback longer than ``MAX_LOG_CHARS`` is cut (the line
says so), and control characters are escaped (:func:`leaseq.core.bounded.text`), so a handler
raising a 5 MB exception, or one full of terminal escapes, writes one short, safe line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from leaseq.core import bounded, tracing
from leaseq.core.redact import redact_logs

#: Longest message, and longest traceback, one log line carries (characters).
MAX_LOG_CHARS = 16384

# holder and term: the leader lease's (the reaper's "lease acquired", "reaped N jobs").
FIELDS = ("job_id", "queue", "job_type", "worker", "attempt", "token", "outcome", "holder", "term")
# Only in JSON lines: the worker's summary line says the same in its text (counts per queue
# and outcome, over that many seconds).
JSON_FIELDS = (*FIELDS, "counts", "seconds")


def _fields(record: logging.LogRecord, names: tuple[str, ...] = FIELDS) -> dict[str, Any]:
    return {name: getattr(record, name) for name in names if hasattr(record, name)}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the context fields, the active
    span's trace_id and span_id, exc if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": bounded.text(record.getMessage(), MAX_LOG_CHARS).value,
            **_fields(record, JSON_FIELDS),
            # The span active where the line was logged (a handler's attempt or step): one
            # filter finds a trace's lines, and a trace viewer the line's trace.
            **tracing.log_fields(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc"] = bounded.text(record.exc_text, MAX_LOG_CHARS).value
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message key=value ...`` for humans."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = bounded.text(record.message, MAX_LOG_CHARS).value
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        text: str = bounded.text(super().formatException(ei), MAX_LOG_CHARS).value
        return text

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_text:
            # Set already (the redacting filter formats tracebacks first): the base class
            # would append it as it is, without formatException's bound.
            record.exc_text = bounded.text(record.exc_text, MAX_LOG_CHARS).value
        text = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        if not extra:
            return text
        head, sep, tail = text.partition("\n")
        return f"{head} {extra}{sep}{tail}"


def configure(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Send every leaseq (and library) log line to ``stream`` (stderr) in ``fmt`` (json or
    text), with secrets masked (:mod:`leaseq.core.redact`)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    redact_logs()
