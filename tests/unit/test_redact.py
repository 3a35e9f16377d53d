"""The one redaction point: every shape of connection string, including malformed ones, and
what psycopg itself says about them."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from leaseq.core import redact

PASSWORD = "S3cret-Pw0rd"

SHAPES = {
    "url": f"postgresql://app:{PASSWORD}@db.example:5432/leaseq",
    "space in password": f"postgresql://app:{PASSWORD} more@db.example/leaseq",
    "at sign in password": f"postgresql://app:{PASSWORD}@x@db.example/leaseq",
    "percent-encoded": "postgresql://app:S3cret%2DPw0rd@db.example/leaseq",
    "missing scheme": f"app:{PASSWORD}@db.example:5432/leaseq",
    "wrong scheme": f"mysql://app:{PASSWORD}@db.example/leaseq",
    "one slash": f"postgres:/app:{PASSWORD}@db.example/leaseq",
    "conninfo": f"host=db.example user=app password={PASSWORD}",
    "conninfo quoted": f"host=db.example password='{PASSWORD} more' user=app",
    "conninfo unquoted space": f"host=db.example password={PASSWORD} more",
}


@pytest.mark.parametrize("conninfo", SHAPES.values(), ids=SHAPES.keys())
def test_shapes_are_masked_without_being_remembered(conninfo: str) -> None:
    text = f"failed to use {conninfo} because reasons"
    assert PASSWORD not in redact.redact(text)
    assert "db.example" in redact.redact(text) or "host" in redact.redact(text)


@pytest.mark.parametrize("conninfo", SHAPES.values(), ids=SHAPES.keys())
def test_psycopg_messages_about_a_remembered_string_are_masked(conninfo: str) -> None:
    redact.remember(conninfo)
    try:
        psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        message = redact.redact(str(exc))
        assert PASSWORD not in message
        assert "S3cret" not in message


def test_malformed_says_what_is_wrong_without_quoting_it() -> None:
    cases = {
        SHAPES["space in password"]: "contains a space",
        SHAPES["missing scheme"]: "neither a postgresql:// URL",
        SHAPES["wrong scheme"]: "scheme is 'mysql'",
        SHAPES["conninfo unquoted space"]: "quote values with spaces",
    }
    for conninfo, words in cases.items():
        said = redact.malformed(conninfo)
        assert words in said
        assert PASSWORD not in said and "S3cret" not in said


def test_nothing_else_changes() -> None:
    text = 'job 7 failed: connection to server at "10.0.0.1", port 5432 failed: timeout'
    assert redact.redact(text) == text
    assert redact.redact("time=12:30:01 queue=ocr") == "time=12:30:01 queue=ocr"


def test_tracebacks_with_chained_causes_are_masked() -> None:
    try:
        try:
            raise ValueError(f"bad {SHAPES['url']}")
        except ValueError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        text = redact.format_exception(exc)
    assert "ValueError" in text and PASSWORD not in text


def test_uncaught_exceptions_in_threads_and_main_are_masked() -> None:
    script = f"""
import threading
from leaseq.core import redact
redact.install_hooks()
def boom():
    raise RuntimeError({SHAPES["missing scheme"]!r})
t = threading.Thread(target=boom)
t.start(); t.join()
raise RuntimeError({SHAPES["conninfo"]!r})
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "RuntimeError" in proc.stderr and "Exception in thread" in proc.stderr
    assert PASSWORD not in proc.stderr
