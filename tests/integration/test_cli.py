"""The operator commands of the `leaseq` CLI against a real database."""

from __future__ import annotations

import json
import sys
import types
from datetime import UTC, datetime, timedelta

import pytest

import leaseq
from leaseq.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_enqueue_status_list_show_retry_cancel_prune(
    database_url: str, queue: leaseq.Queue, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    code, out = run(capsys, "enqueue", "ocr", "extract", "--payload", '{"doc": 1}', "--json", *db)
    assert code == 0
    job_id = json.loads(out)["job_id"]
    [job] = queue.claim(["ocr"], "w1")
    queue.fail(job.lease, "boom", retryable=False)
    queue.enqueue("ocr", "extract", {"doc": 2})

    code, out = run(capsys, "status", "--json", *db)
    [stats] = json.loads(out)["queues"]
    assert (stats["queue"], stats["ready"], stats["dead"]) == ("ocr", 1, 1)
    code, out = run(capsys, "status", *db)
    assert out.splitlines()[0].split() == [
        "QUEUE", "READY", "SCHEDULED", "RUNNING", "DEAD", "HELD", "SUCCEEDED", "1H", "CANCELLED",
        "1H",
        "OLDEST", "READY", "MAX", "HEARTBEAT",
    ]  # fmt: skip
    assert "no workers registered" in out

    code, out = run(capsys, "jobs", "list", "--status", "dead", "--json", *db)
    assert [j["id"] for j in json.loads(out)] == [job_id]
    code, out = run(capsys, "jobs", "list", "--status", "dead", *db)
    assert "boom" in out
    code, out = run(capsys, "jobs", "show", str(job_id), *db)
    assert "failed" in out
    assert "w1" in out
    code, out = run(capsys, "jobs", "show", str(job_id), "--json", *db)
    shown = json.loads(out)
    assert [a["outcome"] for a in shown["attempts"]] == ["failed"]

    code, out = run(capsys, "retry", str(job_id), *db)
    assert (code, queue.get(job_id).status) == (0, "pending")
    code, out = run(capsys, "cancel", str(job_id), "--reason", "not needed", *db)
    assert (code, queue.get(job_id).status) == (0, "cancelled")
    code, out = run(capsys, "cancel", str(job_id), *db)
    assert code == 1
    assert "already cancelled" in out

    code, out = run(capsys, "prune", "--older-than", "0s", "--json", *db)
    assert json.loads(out) == {"deleted": 1}


def test_errors_are_one_line_and_exit_2(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["jobs", "show", "999", "--database-url", database_url]) == 2
    assert "job 999 does not exist" in capsys.readouterr().err
    assert main(["retry", "1", "--database-url", "postgresql://127.0.0.1:1/none"]) == 2
    assert "unreachable" in capsys.readouterr().err


def test_retry_of_a_job_that_is_not_dead_says_why_in_plain_words(
    database_url: str, queue: leaseq.Queue, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    done = queue.enqueue("q", "t").job_id
    [job] = queue.claim(["q"], "w1")
    queue.complete(job.lease)
    waiting = queue.enqueue("q", "t").job_id
    assert main(["retry", str(done), *db]) == 2
    err = capsys.readouterr().err
    assert f"job {done} already succeeded: there is nothing to retry" in err
    assert "is succeeded" not in err
    assert main(["retry", str(waiting), *db]) == 2
    assert f"job {waiting} is still pending: it will run without a retry" in capsys.readouterr().err


def test_worker_refuses_a_bad_configuration_before_starting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASEQ_APP", raising=False)
    assert main(["worker", "--database-url", "postgresql://x/y", "--queue", "q"]) == 2
    assert "--app is required" in capsys.readouterr().err
    argv = ["worker", "--database-url", "postgresql://x/y", "--queue", "q", "--app", "nope:app"]
    assert main(argv) == 2
    assert "cannot import 'nope'" in capsys.readouterr().err


def test_operator_subcommand_passes_every_argument_through(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("leaseq_operator.cli")
    fake.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "leaseq_operator.cli", fake)
    assert main(["operator", "--namespace", "ns", "--help"]) == 0
    assert seen == [["--namespace", "ns", "--help"]]


def _error_line(out: str) -> str:
    [line] = [x for x in out.splitlines() if x.startswith(("last error", "earlier error"))]
    return line


def test_jobs_show_names_the_error_once_and_never_as_the_outcome_of_a_succeeded_job(
    database_url: str, queue: leaseq.Queue, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    job_id = queue.enqueue("ocr", "extract", {}).job_id
    [job] = queue.claim(["ocr"], "w1")
    # What the worker stores for a handler's exception: message and class as the code.
    queue.fail(job.lease, "ValueError: page 3 is blank", error_code="ValueError")
    later = datetime.now(UTC) + timedelta(hours=1)  # past the retry's backoff
    [job] = queue.claim(["ocr"], "w2", now=later)
    queue.complete(job.lease, {"pages": 4}, now=later)

    _, out = run(capsys, "jobs", "show", str(job_id), *db)
    line = _error_line(out)
    assert line.startswith("earlier error"), line
    assert line.count("ValueError") == 1, line
    assert "attempt 1" in line and "then succeeded" in line, line
    _, out = run(capsys, "jobs", "list", *db)
    assert "page 3 is blank" not in out

    dead_id = queue.enqueue("ocr", "extract", {}, max_attempts=1).job_id
    [job] = queue.claim(["ocr"], "w1")
    queue.fail(job.lease, "ValueError: page 3 is blank", error_code="ValueError")
    _, out = run(capsys, "jobs", "show", str(dead_id), *db)
    assert _error_line(out).split(None, 2)[2] == "ValueError: page 3 is blank"
