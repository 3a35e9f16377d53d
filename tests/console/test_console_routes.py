"""The console's pages against a real PostgreSQL, as its own database role: empty, small and
large (capped) data; the admin actions and their audit rows; the read-only refusal."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from starlette.testclient import TestClient

import leaseq
from leaseq.cli.main import main
from leaseq.console import Panel
from leaseq.core.history import History
from leaseq.core.models import SILENT_AFTER_SECONDS, WorkerState
from leaseq.core.workers import Workers
from support.consoledb import ConsoleDb, grant_readonly, make_dead, post
from support.dbtime import claim_one, db_now
from support.steps import context, stop_uncertain

PAGES = ["/", "/jobs", "/dead", "/workers", "/pools", "/schedules", "/audit"]


def test_every_page_renders_on_an_empty_database(console_db: ConsoleDb, client_for) -> None:
    client: TestClient = client_for(console_db.admin_url)
    for page in PAGES:
        answer = client.get(page)
        assert answer.status_code == 200, (page, answer.text)
    assert "No queue has jobs" in client.get("/").text
    assert "No job in this window matches" in client.get("/jobs").text


def test_overview_counts_a_small_queue(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        for i in range(3):
            q.enqueue("ocr", "page", {"i": i})
        q.enqueue("ocr", "page", {"later": True}, delay=3600)
        make_dead(conn, "ocr", "page", 2, "E_BLANK")
    client: TestClient = client_for(console_db.admin_url)
    page = client.get("/").text
    row = page[page.index('data-queue="ocr"') :].split("</tr>")[0]
    cells = [c.split(">", 1)[1].split("<")[0] for c in row.split('<td class="n')[1:]]
    assert cells[:2] == ["3", "1"], row  # ready, scheduled
    assert ">2</a>" in row  # dead
    assert 'id="queues-cut"' not in page  # every queue found is shown


def test_keyed_jobs_are_counted_and_cancellable_as_the_keyless_are(
    console_db: ConsoleDb, client_for
) -> None:
    """Flow control keeps keyed jobs in their own claim index: the overview and the bulk
    cancel read it too, and an aggregate's jobs behind its head are not ready."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        q.enqueue("tenants", "page", {})
        for tenant in ("a", "b"):
            q.enqueue("tenants", "page", {}, key=f"tenant-{tenant}")
        q.enqueue("tenants", "page", {}, key="tenant-a", delay=3600)
        for n in range(3):
            q.enqueue("tenants", "page", {"n": n}, ordering_key="order-17")
    client: TestClient = client_for(console_db.admin_url)
    page = client.get("/").text
    row = page[page.index('data-queue="tenants"') :].split("</tr>")[0]
    cells = [c.split(">", 1)[1].split("<")[0] for c in row.split('<td class="n')[1:]]
    assert cells[:2] == ["4", "1"], row  # ready (1 keyless, 2 keyed, the head), scheduled
    preview = client.get("/cancel", params={"queue": "tenants", "job_type": "page"}).text
    assert "<strong>5</strong> pending job(s) match" in preview, preview


def test_counts_stop_at_the_cap(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type)"
            " SELECT 'big', 't' FROM generate_series(1, 1500)"
        )
        make_dead(conn, "big", "t", 1200, "E")
    client: TestClient = client_for(console_db.admin_url)
    row = client.get("/").text.split('data-queue="big"')[1].split("</tr>")[0]
    assert row.count("1000+") == 2, row  # ready and dead are capped, never counted whole
    assert ">0<" in row  # nothing scheduled, exactly
    dead = client.get("/dead", params={"queue": "big"}).text
    assert "1000" in dead


def test_a_flood_of_queues_does_not_hide_the_backed_up_one(
    console_db: ConsoleDb, client_for
) -> None:
    """250 queues of one fresh job each (a queue per document) and one queue with 150 jobs
    waiting for an hour, named last in the alphabet: it heads the overview, and the page
    says it shows 200 of at least 251 queues."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type)"
            " SELECT 'doc-' || lpad(g::text, 3, '0'), 't' FROM generate_series(1, 250) g"
        )
        conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, available_at)"
            " SELECT 'zz-backlog', 't', now() - interval '1 hour' FROM generate_series(1, 150)"
        )
        make_dead(conn, "zz-dead-only", "t", 3, "E")
    client: TestClient = client_for(console_db.admin_url)
    page = client.get("/").text
    shown = [part.split('"', 1)[0] for part in page.split('data-queue="')[1:]]
    assert len(shown) == 200
    assert shown[0] == "zz-backlog", shown[:3]
    assert "zz-dead-only" not in shown  # nothing ready: less backed up than any doc queue
    assert "Showing 200 of at least 252 queues" in page


def test_jobs_filters_and_keyset_pages(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        ids = [q.enqueue("mail", "send", {"i": i}).job_id for i in range(120)]
        other = q.enqueue("mail", "bounce", {}, idempotency_key="k-7").job_id
        dead = make_dead(conn, "mail", "send", 3, "E_SMTP")
    client: TestClient = client_for(console_db.admin_url)
    first = client.get("/jobs", params={"queue": "mail", "job_type": "send"}).text
    assert f'data-job="{dead[-1]}"' in first
    assert f'data-job="{other}"' not in first
    assert "OFFSET" not in first
    older = first.split('id="older" href="')[0] if False else first
    assert 'id="older"' in older
    href = first.split('href="')[-1]  # the last link on the page is "Older"
    second = client.get(href.split('"')[0].replace("&amp;", "&")).text
    shown = {int(x.split('"')[0]) for x in second.split('data-job="')[1:]}
    assert shown and max(shown) < min(dead) and shown <= set(ids)
    by_key = client.get("/jobs", params={"key": "k-7"}).text
    assert f'data-job="{other}"' in by_key and by_key.count("data-job=") == 1
    by_code = client.get("/jobs", params={"error_code": "E_SMTP", "status": "dead"}).text
    assert by_code.count("data-job=") == 3
    bad = client.get("/jobs", params={"status": "lost"})
    assert bad.status_code == 400 and "Traceback" not in bad.text


def test_job_page_shows_the_attempt_timeline(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        job = q.enqueue("ocr", "page", {"doc": 1}, max_attempts=1).job_id
        claimed = q.claim(["ocr"], owner="w-1", lease_seconds=30)[0]
        q.fail(claimed.lease, "scanner jammed", error_code="E_JAM")
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/jobs/{job}").text
    assert "dead" in page and "w-1" in page and "scanner jammed" in page and "E_JAM" in page
    assert client.get("/jobs/999999").status_code == 404


def test_job_page_shows_steps_and_the_uncertain_one_with_its_command(
    console_db: ConsoleDb, client_for
) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        job = q.enqueue("q", "agent", {}).job_id
        first = context(q, claim_one(q))
        first.step("fetch", lambda: {"pages": 3, "api_key": "sk-live-1"})
        first.step("big", lambda: "x" * 70000)
        first.emit({"page": 1})
        client: TestClient = client_for(console_db.admin_url)
        seen: list[str] = []

        def render() -> None:
            page = client.get(f"/jobs/{job}").text
            seen.append(page.split('data-step="render"')[1].split("</tr>")[0])

        first.step("render", render)
        # Intended by the attempt that holds the job: running, not uncertain.
        assert "running" in seen[0] and "uncertain" not in seen[0]
        stop_uncertain(q, conn, first, "bill card")
    page = client.get(f"/jobs/{job}").text
    steps = page[page.index('id="job-steps"') :].split("</table>")[0]
    fetch = steps.split('data-step="fetch"')[1].split("</tr>")[0]
    assert "recorded" in fetch and "&#34;pages&#34;: 3" in fetch
    assert "sk-live-1" not in page and "***" in fetch  # the console's redactor
    assert "over 64 KiB" in steps.split('data-step="big"')[1].split("</tr>")[0]
    bill = steps.split('data-step="bill card"')[1].split("</tr>")[0]
    assert "uncertain" in bill and ">1</td>" in bill  # intended by attempt 1
    assert 'id="uncertain-step">bill card<' in page
    assert f"leaseq steps resolve {job} &#39;bill card&#39; --retry" in page
    assert "Stream: 1 items, the last at offset 1" in page

    with leaseq.connect(console_db.owner_url, action="test") as conn:
        leaseq.Queue(conn).resolve_step(job, "bill card", retry=True, actor="ops", reason="no")
    page = client.get(f"/jobs/{job}").text
    assert 'id="step-uncertain"' not in page
    assert "not started, resolved by ops" in page


def test_job_page_shows_what_a_job_waits_for_and_the_command_that_sends_it(
    console_db: ConsoleDb, client_for
) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        job = q.enqueue("q", "agent", {}).job_id
        claimed = claim_one(q)
        with pytest.raises(leaseq.Waiting) as raised:
            context(q, claimed).wait_for("approve draft", timeout=3600)
        q.wait(claimed.lease, raised.value.name, raised.value.until)
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/jobs/{job}").text
    assert 'id="waiting-for">approve draft<' in page
    assert f"leaseq signal {job} &#39;approve draft&#39; --payload JSON" in page
    since = page.split('id="waiting-since">')[1].split("<")[0]
    assert since[:4].isdigit()  # a time, shown
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        leaseq.Queue(conn).signal(job, "approve draft")
        claim_one(leaseq.Queue(conn))  # running again: it waits for nothing now
    assert 'id="job-waiting"' not in client.get(f"/jobs/{job}").text


def test_a_job_s_steps_come_in_keyset_pages(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        job = q.enqueue("q", "agent", {}).job_id
        ctx = context(q, claim_one(q))
        for i in range(52):
            ctx.step(f"page-{i:02d}", lambda: None)
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/jobs/{job}").text
    assert page.count("data-step=") == 50 and 'data-step="page-49"' in page
    assert f'href="/jobs/{job}?steps_after=page-49"' in page
    rest = client.get(f"/jobs/{job}", params={"steps_after": "page-49"}).text
    assert rest.count("data-step=") == 2 and 'id="steps-after-next"' not in rest


def test_retry_one_dead_job_writes_the_audit(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        [job_id] = make_dead(conn, "ocr", "page", 1, "E")
    client: TestClient = client_for(console_db.admin_url)
    answer = post(client, f"/jobs/{job_id}/retry", {"reason": "scanner fixed"})
    assert answer.status_code == 200, answer.text
    assert "1 of 1 job(s) retried" in answer.text
    with psycopg.connect(console_db.owner_url) as conn:
        status = conn.execute("SELECT status FROM leaseq.jobs WHERE id = %s", (job_id,)).fetchone()
        audit = conn.execute(
            "SELECT actor, db_role, action, job_ids, reason FROM leaseq.console_audit"
        ).fetchall()
    assert status == ("pending",)
    assert audit == [("local", console_db.admin_role, "retry_dead", [job_id], "scanner fixed")]
    assert "scanner fixed" in client.get("/audit").text


def test_the_console_s_retry_of_a_job_dead_waiting_withdraws_only_that_wait_s_deadline(
    console_db: ConsoleDb, client_for
) -> None:
    """The console's retry revives through leaseq.retry_dead, as `leaseq retry` does: the
    deadline of the wait a job died at (WaitTimedOut) goes, so its next attempt waits afresh;
    an answered wait, a caught earlier timeout and another error's job keep theirs."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        [timed_out] = make_dead(conn, "q", "approval", 1, "WaitTimedOut")
        [other] = make_dead(conn, "q", "approval", 1, "E")
        for job, name, minutes in [
            (timed_out, "leaseq.wait-1", 1),  # answered
            (timed_out, "leaseq.wait-1.signal", 2),
            (timed_out, "leaseq.wait-2", 3),  # timed out, caught by the handler
            (timed_out, "leaseq.wait-3", 4),  # timed out, the job died of it
            (other, "leaseq.wait-1", 1),
        ]:
            conn.execute(
                "INSERT INTO leaseq.job_steps (job_id, name, attempt, lease_token, intended_at,"
                " finished_at, result) SELECT %s, %s, 1, 1, t, t, to_jsonb(t::text)"
                " FROM (SELECT now() - make_interval(mins => 10 - %s) AS t) x",
                (job, name, minutes),
            )
    client: TestClient = client_for(console_db.admin_url)
    for job in (timed_out, other):
        answer = post(client, f"/jobs/{job}/retry", {"reason": "approver back"})
        assert "1 of 1 job(s) retried" in answer.text
    with psycopg.connect(console_db.owner_url) as conn:
        steps = conn.execute(
            "SELECT job_id, name, finished_at IS NOT NULL, resolved_by FROM leaseq.job_steps"
            " ORDER BY job_id, name"
        ).fetchall()
    assert steps == [
        (timed_out, "leaseq.wait-1", True, None),
        (timed_out, "leaseq.wait-1.signal", True, None),
        (timed_out, "leaseq.wait-2", True, None),
        (timed_out, "leaseq.wait-3", False, "retry"),
        (other, "leaseq.wait-1", True, None),
    ]


def test_bulk_retry_by_filter_shows_the_count_first(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        jam = make_dead(conn, "ocr", "page", 4, "E_JAM")
        make_dead(conn, "ocr", "page", 2, "E_OTHER")
    client: TestClient = client_for(console_db.admin_url)
    preview = client.get("/dead", params={"queue": "ocr", "error_code": "E_JAM"}).text
    assert "<strong>4</strong> dead job(s) match" in preview
    answer = post(client, "/dead/retry", {"queue": "ocr", "error_code": "E_JAM", "reason": "fix"})
    assert "4 of 4 job(s) retried" in answer.text, answer.text
    with psycopg.connect(console_db.owner_url) as conn:
        left = conn.execute("SELECT count(*) FROM leaseq.jobs WHERE status = 'dead'").fetchone()
        [(ids, flt)] = conn.execute("SELECT job_ids, filter FROM leaseq.console_audit").fetchall()
    assert left == (2,)
    assert sorted(ids) == sorted(jam) and flt == {"queue": "ocr", "error_code": "E_JAM"}


def test_bulk_cancel_of_pending_jobs(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        for _ in range(3):
            q.enqueue("ocr", "page", {})
        q.enqueue("ocr", "other", {})
    client: TestClient = client_for(console_db.admin_url)
    preview = client.get("/cancel", params={"queue": "ocr", "job_type": "page"}).text
    assert "<strong>3</strong> pending job(s) match" in preview
    answer = post(client, "/cancel", {"queue": "ocr", "job_type": "page", "reason": "bad batch"})
    assert "3 of 3 job(s) cancelled" in answer.text, answer.text


def test_a_read_only_role_gets_a_clear_refusal(console_db: ConsoleDb, client_for) -> None:
    grant_readonly(console_db)
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        [job_id] = make_dead(conn, "ocr", "page", 1, "E")
    client: TestClient = client_for(console_db.readonly_url)
    page = client.get(f"/jobs/{job_id}").text
    assert 'id="read-only"' in page
    answer = post(client, f"/jobs/{job_id}/retry", {"reason": "try"})
    assert answer.status_code == 403
    assert "Refused by the database" in answer.text and "read-only" in answer.text
    assert "permission denied for function console_retry_dead." in answer.text
    assert "Traceback" not in answer.text and "psycopg" not in answer.text
    with psycopg.connect(console_db.owner_url) as conn:
        assert conn.execute("SELECT status FROM leaseq.jobs").fetchone() == ("dead",)
        assert conn.execute("SELECT count(*) FROM leaseq.console_audit").fetchone() == (0,)


def test_the_console_role_cannot_write_tables_directly(console_db: ConsoleDb) -> None:
    with psycopg.connect(console_db.admin_url) as conn:
        try:
            conn.execute("UPDATE leaseq.jobs SET status = 'pending'")
        except psycopg.errors.InsufficientPrivilege:
            pass
        else:
            raise AssertionError("the console role could update leaseq.jobs")
        conn.rollback()
        try:
            conn.execute(
                "INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason)"
                " VALUES ('x', 'cancel', '{}', 0, 'forged')"
            )
        except psycopg.errors.InsufficientPrivilege:
            pass
        else:
            raise AssertionError("the console role could forge an audit row")


def test_a_reason_is_required(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        [job_id] = make_dead(conn, "ocr", "page", 1, "E")
    client: TestClient = client_for(console_db.admin_url)
    answer = post(client, f"/jobs/{job_id}/retry", {"reason": "  "})
    assert answer.status_code == 400 and "say why" in answer.text


def test_a_job_moved_to_history_keeps_its_page(console_db: ConsoleDb, client_for) -> None:
    """The job page reads the hot table, the history or the ledger, wherever the job is."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        job = q.enqueue("ocr", "page", {"doc": "old"}, max_attempts=1).job_id
        claimed = q.claim(["ocr"], owner="w-old", lease_seconds=30)[0]
        q.fail(claimed.lease, "ancient error", error_code="E_OLD")
        history = History(conn)
        history.ensure_partitions(ahead=2, timeout=10)
        assert history.move(hot_retention=0, batch=100, timeout=30).moved == 1
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/jobs/{job}").text
    assert "history" in page and "w-old" in page and "ancient error" in page


def test_every_page_is_bounded_by_the_statement_timeout(console_db: ConsoleDb, client_for) -> None:
    """A page whose statement cannot finish (here: the jobs table locked by a migration-like
    lock) ends at the console's timeout with a page saying so, never a hung request."""
    client: TestClient = client_for(console_db.admin_url, timeout=0.5)
    with psycopg.connect(console_db.owner_url) as locker:
        locker.execute("LOCK TABLE leaseq.jobs IN ACCESS EXCLUSIVE MODE")
        for path in ("/", "/jobs", "/dead", "/workers"):
            answer = client.get(path)
            assert answer.status_code == 503, (path, answer.text)
            assert "did not answer within 0.5 s" in answer.text
    assert client.get("/").status_code == 200


def test_worker_pools_when_readable_and_when_not(console_db: ConsoleDb, client_for) -> None:
    pool = {
        "metadata": {"namespace": "jobs", "name": "ocr-pool"},
        "spec": {"queue": "ocr", "minReplicas": 0, "maxReplicas": 8},
        "status": {"desiredReplicas": 3, "conditions": [{"type": "Scaling"}]},
    }
    readable: TestClient = client_for(console_db.admin_url, pools=lambda: ([pool], None))
    page = readable.get("/pools").text
    assert "ocr-pool" in page and "0-8" in page and "Scaling" in page
    denied: TestClient = client_for(
        console_db.admin_url, pools=lambda: (None, "cannot read WorkerPools: Forbidden")
    )
    answer = denied.get("/pools")
    assert answer.status_code == 200 and "not shown: cannot read WorkerPools" in answer.text


def test_more_overview_panels_plug_in(console_db: ConsoleDb, client_for) -> None:
    """The place later features (keys, limits, pipelines) add their overview panels."""
    panel = Panel(
        "Pipelines", "<p id='pipelines'>{{ n }} running</p>", lambda console: {"n": "<b>2"}
    )
    client: TestClient = client_for(console_db.admin_url, panels=[panel])
    page = client.get("/").text
    assert "<h2>Pipelines</h2>" in page
    assert "<p id='pipelines'>&lt;b&gt;2 running</p>" in page  # autoescaped


def test_a_silent_worker_is_silent_on_the_console_as_in_status(
    console_db: ConsoleDb, client_for, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SIGKILLed worker's row still says ``running``: the console and ``leaseq status``
    apply one rule (no registry heartbeat for SILENT_AFTER_SECONDS) and both say silent."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        now = db_now(conn)
        workers = Workers(conn)
        for name, age in (("w-killed", SILENT_AFTER_SECONDS + 20), ("w-live", 0.0)):
            workers.register(name, pod=None, node=None, queues=["ocr"], concurrency=2,
                             state=WorkerState.RUNNING, in_flight=0,
                             now=now - timedelta(seconds=age))  # fmt: skip
    client: TestClient = client_for(console_db.admin_url)
    page = client.get("/workers").text
    killed = page[page.index("<td>w-killed</td>") :].split("</tr>")[0]
    live = page[page.index("<td>w-live</td>") :].split("</tr>")[0]
    assert "silent (last running)" in killed and " bad" in killed, killed
    assert "silent" not in live and "<td>running</td>" in live and " bad" not in live, live
    overview = client.get("/").text
    row = overview[overview.index('data-queue="ocr"') :].split("</tr>")[0]
    cells = [c.split(">", 1)[1].split("<")[0] for c in row.split('<td class="n')[1:]]
    assert cells[-2] == "1", row  # workers: the live one only
    assert main(["status", "--database-url", console_db.owner_url]) == 0
    out = capsys.readouterr().out
    assert "silent (last running)" in out.split("w-killed", 1)[1].splitlines()[0], out


def test_the_console_cancels_a_job_whose_refused_renewal_found_its_lease_expired(
    console_db: ConsoleDb,
) -> None:
    """No reaper ran: the refused renewal recorded the attempt (fenced) under the job's own
    token; the console's cancels, like `leaseq cancel`, keep that row instead of failing."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        then = db_now(conn) - timedelta(minutes=1)
        alone = q.enqueue("ocr", "page", now=then).job_id
        graph = leaseq.Graph("doc")
        graph.add("ocr", "page", name="page")
        made = q.enqueue_graph(graph, now=then)
        held = q.claim(["ocr"], "w1", limit=2, lease_seconds=5, now=then)
        assert sorted(j.id for j in held) == sorted([alone, made["page"]])
        for job in held:
            assert q.heartbeat(job.lease).status is leaseq.HeartbeatStatus.LOST
    with leaseq.connect(console_db.admin_url, action="test") as conn:
        console = leaseq.core.console.Console(conn)
        assert console.cancel([alone], actor="alice", reason="stuck") == [alone]
        assert console.cancel_pipeline(made.pipeline_id, actor="alice", reason="stuck") == (1, 1)
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        for job_id in (alone, made["page"]):
            assert q.get(job_id).status == "cancelled"
            assert [a.outcome for a in q.attempts(job_id)] == ["fenced"]


def _uncertain_job(db: ConsoleDb) -> int:
    """A job held at its uncertain step "bill card" (StepUncertain)."""
    with leaseq.connect(db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        job = q.enqueue("q", "agent", {}).job_id
        stop_uncertain(q, conn, context(q, claim_one(q)), "bill card")
    return job


def _step_and_audit(db: ConsoleDb, job: int) -> tuple[tuple[object, ...], list[tuple[object, ...]]]:
    with psycopg.connect(db.owner_url) as conn:
        step = conn.execute(
            "SELECT j.status, s.finished_at IS NOT NULL, s.lease_token IS NOT NULL, s.result,"
            " s.resolved_by, s.resolve_reason FROM leaseq.jobs j"
            " JOIN leaseq.job_steps s ON s.job_id = j.id AND s.name = 'bill card'"
            " WHERE j.id = %s",
            (job,),
        ).fetchone()
        audit = conn.execute(
            "SELECT actor, db_role, action, job_ids, asked, reason, filter"
            " FROM leaseq.console_audit ORDER BY id"
        ).fetchall()
    assert step is not None
    return step, audit


def test_settle_an_uncertain_step_with_its_result(console_db: ConsoleDb, client_for) -> None:
    """The job page's form records the step's result as the console user, through the
    same function as `leaseq steps resolve`, audits it, and the job is pending again."""
    job = _uncertain_job(console_db)
    client: TestClient = client_for(console_db.admin_url)
    # The overview lists the held job first, under what needs a human.
    overview = client.get("/").text
    held = overview[overview.index('<section id="needs-a-human"') :].split("</section>")[0]
    assert f'<tr data-job="{job}"><td><a href="/jobs/{job}">{job}</a>' in held
    assert "<code>bill card</code>" in held
    page = client.get(f"/jobs/{job}").text
    form = page[page.index(f'action="/jobs/{job}/steps/resolve" id="resolve-step-form"') :]
    form = form.split("</form>")[0]
    assert 'name="step" value="bill card"' in form
    sent = {"step": "bill card", "settle": "result", "result": '{"charged": "by hand"}'}
    answer = post(client, f"/jobs/{job}/steps/resolve", {**sent, "reason": "the bank says paid"})
    assert answer.status_code == 200, answer.text
    assert "1 of 1 job(s) resumed (step &#39;bill card&#39; recorded)" in answer.text
    step, audit = _step_and_audit(console_db, job)
    assert step == ("pending", True, True, {"charged": "by hand"}, "local", "the bank says paid")
    assert audit == [
        (
            "local",
            console_db.admin_role,
            "resolve_step",
            [job],
            1,
            "the bank says paid",
            {"step": "bill card", "retry": False},
        )
    ]
    page = client.get(f"/jobs/{job}").text
    assert 'id="resolve-step-form"' not in page
    assert "recorded, resolved by local" in page
    assert 'id="needs-a-human"' not in client.get("/").text
    # Settled already: nothing more is settled, and the audit says so.
    again = post(client, f"/jobs/{job}/steps/resolve", {**sent, "reason": "twice"})
    assert "0 of 1 job(s) resumed" in again.text, again.text
    # Why, as `leaseq steps resolve` says it.
    assert f"(job {job} step &#39;bill card&#39; is not uncertain: it has a result)" in again.text
    assert _step_and_audit(console_db, job)[0] == step
    other = post(client, f"/jobs/{job}/steps/resolve", {**sent, "step": "ship", "reason": "r"})
    assert f"0 of 1 job(s) resumed (step &#39;ship&#39; recorded) (job {job} has no step" in (
        other.text
    )
    gone = post(client, "/jobs/999999/steps/resolve", {**sent, "reason": "r"})
    assert "(job 999999 does not exist)" in gone.text


def test_settle_an_uncertain_step_to_run_again(console_db: ConsoleDb, client_for) -> None:
    job = _uncertain_job(console_db)
    client: TestClient = client_for(console_db.admin_url)
    # The retry button sends the (empty) result box too: it is not read.
    form = {"step": "bill card", "settle": "retry", "result": "", "reason": "not in the ledger"}
    answer = post(client, f"/jobs/{job}/steps/resolve", form)
    assert "1 of 1 job(s) resumed (step &#39;bill card&#39; to run again)" in answer.text
    step, audit = _step_and_audit(console_db, job)
    assert step == ("pending", False, False, None, "local", "not in the ledger")
    assert audit[0][2:] == (
        "resolve_step",
        [job],
        1,
        "not in the ledger",
        {"step": "bill card", "retry": True},
    )


@pytest.mark.parametrize(
    ("form", "complaint"),
    [
        ({"settle": "result", "result": "{paid"}, "invalid result: is not JSON (Expecting"),
        ({"settle": "result", "result": ""}, "invalid result: is not JSON"),
        ({"settle": "result", "result": "[" * 100_000}, "invalid result: nests too deeply"),
        # Under the form's 1 MiB a field (each 1E2 and its comma, %2C, are 6 bytes posted),
        # over it as JSON (each is 100.0 and a comma and a space).
        (
            {"settle": "result", "result": "[" + ",".join(["1E2"] * 170_000) + "]"},
            "is 1190000 bytes as JSON; the limit is 1048576",
        ),
        (
            {"settle": "result", "result": '"' + "x" * 1_048_576 + '"'},
            "invalid form: is refused: Field exceeded maximum size of 1024KB.",
        ),
        ({"settle": "result", "result": "NaN"}, "step &#39;bill card&#39; result"),
        ({"settle": "maybe", "result": "1"}, "invalid settle: must be result or retry"),
        ({"settle": "retry", "step": "x" * 201}, "invalid step: must be a name of 1-200"),
        ({"settle": "retry", "reason": " "}, "say why"),
    ],
)
def test_a_bad_settlement_is_refused_and_writes_nothing(
    console_db: ConsoleDb, client_for, form: dict[str, str], complaint: str
) -> None:
    job = _uncertain_job(console_db)
    before = _step_and_audit(console_db, job)
    client: TestClient = client_for(console_db.admin_url)
    answer = post(
        client, f"/jobs/{job}/steps/resolve", {"step": "bill card", "reason": "r", **form}
    )
    assert answer.status_code == 400, answer.text
    assert complaint in answer.text and "Traceback" not in answer.text
    assert _step_and_audit(console_db, job) == before
    assert before[0][0] == "held" and before[1] == []
