"""Issue 11's limits on a real PostgreSQL: queue names (at enqueue, at worker start and in
the schema), effect keys scoped to queue and job type, control characters in CLI output,
and the HTTP endpoints' bind address."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import CollectorRegistry

import leaseq
from leaseq.cli.main import main
from leaseq.runtime.http_server import ProbeServer
from leaseq.runtime.settings import WorkerSettings
from leaseq_operator.cli import build_parser as operator_parser
from leaseq_operator.config import OperatorConfig
from leaseq_operator.metrics import OperatorMetrics
from support import net

BAD_QUEUES = ["a b", "q\n", "\x1b[2Jq", "-q", "_other", "q/1", "é", "x" * 129, ""]


@pytest.mark.parametrize("name", BAD_QUEUES)
def test_enqueue_refuses_a_bad_queue_name(queue: leaseq.Queue, name: str) -> None:
    with pytest.raises(leaseq.InvalidJob) as refused:
        queue.enqueue(name, "t")
    assert refused.value.field == "queue"
    assert queue.jobs() == []


@pytest.mark.parametrize("name", ["q", "ocr.v2", "tenant-7:ocr", "A_1", "x" * 128])
def test_good_queue_names_pass_everywhere(queue: leaseq.Queue, name: str) -> None:
    queue.enqueue(name, "t")
    settings_of([name])


def settings_of(queues: list[str], **extra: str) -> WorkerSettings:
    env = {"LEASEQ_DATABASE_URL": "postgresql://db/x", "LEASEQ_APP": "a:b", **extra}
    from leaseq.cli.main import build_parser

    args = build_parser().parse_args(["worker", *(f"--queue={q}" for q in queues)])
    return WorkerSettings.from_args(args, env)


@pytest.mark.parametrize("name", [q for q in BAD_QUEUES if q and q.strip() == q])
def test_a_worker_refuses_to_start_on_a_bad_queue_name(name: str) -> None:
    with pytest.raises(leaseq.ConfigError, match=r"--queue .*is not a queue name|limit is 128"):
        settings_of(["ok", name])


def test_the_schema_refuses_a_bad_queue_name_from_raw_sql(conn: leaseq.core.db.Conn) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_queue_name"):
        conn.execute("INSERT INTO leaseq.jobs (queue, job_type) VALUES (%s, 't')", ["a\nb"])


def test_effect_keys_are_scoped_to_queue_and_job_type(queue: leaseq.Queue) -> None:
    """A job in one queue (or of another type) can no longer find its key taken by another
    queue's job, report success and have no effect of its own."""
    for q, t in [("billing", "invoice"), ("other", "invoice"), ("billing", "receipt")]:
        queue.enqueue(q, t, {"q": q}, idempotency_key="doc-412")
        [job] = queue.claim([q], "w1")
        done = queue.complete(job.lease, {"by": f"{q}/{t}"})
        assert isinstance(done, leaseq.Completed) and done.effect_written, (q, t)
    queue.enqueue("billing", "invoice", idempotency_key="doc-412")
    [repeat] = queue.claim(["billing"], "w2")
    again = queue.complete(repeat.lease, {"by": "repeat"})
    assert isinstance(again, leaseq.Completed) and not again.effect_written
    effect = queue.effect("doc-412", queue="other", job_type="invoice")
    assert effect is not None and effect.result == {"by": "other/invoice"}
    with pytest.raises(leaseq.InvalidJob, match="more than one queue or job type"):
        queue.effect("doc-412")
    single = queue.effect("doc-412", queue="billing", job_type="receipt")
    assert single is not None and single.job_type == "receipt"


def test_cli_tables_escape_control_characters_and_mask_passwords(
    database_url: str, queue: leaseq.Queue, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = "\x1b[2J\x1b[31mowned\r\n\u202efdp.exe"
    job_id = queue.enqueue("q", "t" + evil).job_id
    [job] = queue.claim(["q"], "w" + evil)
    queue.fail(job.lease, "boom postgresql://app:Hidden-Pw-99@db/x" + evil, retryable=False)
    leaseq.Workers(queue._db).register(  # type: ignore[arg-type]
        "w" + evil, pod=evil, node=None, queues=["q"], concurrency=1,
        state=leaseq.WorkerState.RUNNING, in_flight=0,
    )  # fmt: skip
    db = ["--database-url", database_url]
    for argv in (["status"], ["jobs", "list"], ["jobs", "show", str(job_id)]):
        assert main([*argv, *db]) == 0, argv
        out = capsys.readouterr().out
        assert not any(c in out for c in "\x1b\r\u202e"), (argv, out)
        assert "\\x1b[2J" in out, (argv, out)
        assert "Hidden-Pw-99" not in out, (argv, out)


def test_http_endpoints_bind_where_told() -> None:
    port = net.free_port()
    server = ProbeServer(
        port, CollectorRegistry(), lambda: (True, "ok"), lambda: (True, "ok"), address="127.0.0.1"
    )
    server.start()
    try:
        assert server._server.server_address[0] == "127.0.0.1"
        assert net.get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
    finally:
        server.stop()
    env = {"LEASEQ_DATABASE_URL": "postgresql://db/x", "LEASEQ_METRICS_ADDRESS": "127.0.0.1"}
    operator = OperatorConfig.from_args(operator_parser().parse_args([]), env)
    assert operator.metrics_address == "127.0.0.1"
    assert settings_of(["q"], LEASEQ_METRICS_ADDRESS="::1").metrics_address == "::1"
    metrics = OperatorMetrics()
    metrics.serve(port, operator.metrics_address)
    try:
        assert metrics._server is not None
        assert metrics._server.server_address[0] == "127.0.0.1"
    finally:
        metrics.close()
    with pytest.raises(leaseq.ConfigError, match="LEASEQ_METRICS_ADDRESS='every'"):
        OperatorConfig.from_args(
            operator_parser().parse_args([]), {**env, "LEASEQ_METRICS_ADDRESS": "every"}
        )
