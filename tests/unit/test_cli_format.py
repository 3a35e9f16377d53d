"""CLI formatting and argument parsing."""

from __future__ import annotations

import argparse
import json
import logging
from datetime import UTC, datetime

import pytest

from leaseq.cli.args import duration, json_argument
from leaseq.cli.main import main
from leaseq.cli.tables import age, table, to_json
from leaseq.core.models import Enqueued
from leaseq.runtime.logs import JsonFormatter, TextFormatter


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.25, "0.2s"), (42, "42s"), (192, "3m12s"), (7500, "2h05m"), (273600, "3d04h")],
)
def test_age(seconds: float | None, text: str) -> None:
    assert age(seconds) == text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15min", 900), ("12h", 43200), ("7d", 604800), ("2w", 1209600)],
)
def test_duration(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["1m", "15m", "1 m", "1M", "3mo"])
def test_a_duration_in_m_is_refused_as_ambiguous(text: str) -> None:
    # `prune --older-than 1m` once deleted everything older than a minute, dead jobs included.
    with pytest.raises(argparse.ArgumentTypeError, match=r"ambiguous .*30min"):
        duration(text)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        duration("soon")
    with pytest.raises(argparse.ArgumentTypeError, match="is not JSON"):
        json_argument("{oops")


@pytest.mark.parametrize(
    "command",
    [
        ["enqueue", "ocr", "scan", "--payload"],
        ["schedules", "add", "n", "0 3 * * *", "--queue", "q", "--job-type", "t", "--payload"],
        ["signal", "7", "approved", "--payload"],
    ],
)
@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("{paid", "argument --payload: is not JSON (Expecting property name"),
        # Deeper than Python's parser recurses: RecursionError, not a traceback.
        ("[" * 100_000, "argument --payload: nests too deeply to be read"),
    ],
    ids=["not-json", "too-deep"],
)
def test_every_json_argument_refuses_bad_json_naming_it(
    command: list[str],
    text: str,
    complaint: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LEASEQ_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        main([*command, text])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert complaint in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("{paid", "invalid --result: is not JSON (Expecting property name"),
        # Deeper than Python's parser recurses: RecursionError, not a traceback.
        ("[" * 100_000, "invalid --result: nests too deeply to be read"),
    ],
)
def test_steps_resolve_refuses_a_bad_result_before_connecting(
    text: str, complaint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASEQ_DATABASE_URL", raising=False)
    assert main(["steps", "resolve", "7", "charge", "--result", text, "--reason", "r"]) == 2
    assert complaint in capsys.readouterr().err


def test_table_aligns_text_left_and_numbers_right() -> None:
    text = table(["QUEUE", "READY"], [["ocr", 5], ["inference", 120], ["x", None]])
    assert text.splitlines() == [
        "QUEUE      READY",
        "ocr            5",
        "inference    120",
        "x              -",
    ]


def test_to_json_handles_dataclasses_and_datetimes() -> None:
    moment = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    data = json.loads(to_json({"job": Enqueued(3, True), "at": moment}))
    assert data == {"job": {"job_id": 3, "created": True}, "at": "2024-05-01T12:00:00+00:00"}


def record(**extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("leaseq.worker", logging.INFO, __file__, 1, "claimed %s", ("x",), None)
    rec.__dict__.update(extra)
    return rec


def test_json_log_lines_carry_the_job_fields() -> None:
    line = json.loads(JsonFormatter().format(record(job_id=4, queue="q", worker="w", token=2)))
    assert line["msg"] == "claimed x"
    assert (line["job_id"], line["queue"], line["worker"], line["token"]) == (4, "q", "w", 2)
    assert "attempt" not in line


def test_text_log_lines_append_key_values() -> None:
    assert (
        TextFormatter().format(record(job_id=4, attempt=1)).endswith("claimed x job_id=4 attempt=1")
    )
