"""The console's pipeline pages against a real PostgreSQL, as its own database role: waiting
counts and the waiting filter, a job's pipeline, parents, children and cancelled_by (keyset
pages), the pipelines list (keyset, newest first), a pipeline's counters and jobs (finished
or not; its dead ones by a link), and the "cancel pipeline" action: the same jobs `leaseq
pipelines cancel` cancels, fenced, audited in the same transaction, refused by the database
for a read-only role."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from starlette.testclient import TestClient

import leaseq
from leaseq import Graph
from leaseq.core.console import Console
from leaseq.core.history import History
from leaseq.core.models import JobStatus
from support.consoledb import ConsoleDb, grant_readonly, post
from support.dbtime import db_now


def ocr_graph(pages: int, name: str = "doc", queue: str = "ocr") -> Graph:
    g = Graph(name)
    parts = [g.add(queue, "page", {"page": n}, name=f"page-{n}") for n in range(pages)]
    merge = g.add(queue, "merge", name="merge", after=parts)
    g.add(queue, "embed", name="embed", after=[merge])
    return g


def _ids(page: str, attribute: str) -> list[int]:
    return [int(x.split('"')[0]) for x in page.split(f'{attribute}="')[1:]]


def test_overview_and_jobs_filter_know_waiting(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        made = leaseq.Queue(conn).enqueue_graph(ocr_graph(3))
    client: TestClient = client_for(console_db.admin_url)
    row = client.get("/").text.split('data-queue="ocr"')[1].split("</tr>")[0]
    assert "status=waiting" in row and ">2</a>" in row, row  # merge and embed wait
    waiting = client.get("/jobs", params={"queue": "ocr", "status": "waiting"}).text
    assert sorted(_ids(waiting, "data-job")) == sorted([made["merge"], made["embed"]])


def test_a_queue_with_only_waiting_jobs_is_on_the_overview(
    console_db: ConsoleDb, client_for
) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        parent = q.enqueue("ocr", "page", {}).job_id
        q.enqueue("later", "merge", {}, after=[parent])
        claimed = q.claim(["ocr"], owner="w", lease_seconds=30)[0]
        del claimed  # running: the ocr queue has no pending job any more
    client: TestClient = client_for(console_db.admin_url)
    row = client.get("/").text.split('data-queue="later"')[1].split("</tr>")[0]
    assert "status=waiting" in row and ">1</a>" in row, row


def test_a_job_page_shows_its_pipeline_parents_and_children(
    console_db: ConsoleDb, client_for
) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        made = leaseq.Queue(conn).enqueue_graph(ocr_graph(60))
    client: TestClient = client_for(console_db.admin_url)
    merge = client.get(f"/jobs/{made['merge']}").text
    assert f'href="/pipelines/{made.pipeline_id}" id="job-pipeline-link"' in merge
    parents = [made[f"page-{n}"] for n in range(60)]
    first = _ids(merge.split('id="job-parents"')[1].split("</table>")[0], "data-link")
    assert first == parents[:50]  # one page of 50, in id order
    children = _ids(merge.split('id="job-children"')[1].split("</table>")[0], "data-link")
    assert children == [made["embed"]]
    more = merge.split('id="parents_after-next"')[0].rsplit('href="', 1)[1].split('"')[0]
    rest = client.get(more.replace("&amp;", "&")).text
    second = _ids(rest.split('id="job-parents"')[1].split("</table>")[0], "data-link")
    assert second == parents[50:]
    assert 'id="parents_after-next"' not in rest
    page = client.get(f"/jobs/{made['page-0']}").text
    assert _ids(page.split('id="job-children"')[1].split("</table>")[0], "data-link") == [
        made["merge"]
    ]
    assert 'id="job-parents"' not in page  # a root has none
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        plain = leaseq.Queue(conn).enqueue("ocr", "x", {}).job_id
    assert 'id="pipeline-links"' not in client.get(f"/jobs/{plain}").text


def test_a_cascade_cancelled_job_shows_what_cancelled_it(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        g = Graph("fails")
        bad = g.add("ocr", "page", {}, name="bad", max_attempts=1)
        g.add("ocr", "merge", name="merge", after=[bad])
        made = q.enqueue_graph(g)
        claimed = q.claim(["ocr"], owner="w-1", lease_seconds=30)[0]
        q.fail(claimed.lease, "blank page", error_code="E_BLANK")
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/jobs/{made['merge']}").text
    assert 'id="cancelled-by"' in page
    cause = page.split('id="cancelled-by"')[1].split("</td>")[0]
    assert f'href="/jobs/{made["bad"]}"' in cause


def test_pipelines_list_is_keyset_paged_newest_first(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        rows = conn.execute(
            "INSERT INTO leaseq.pipelines (name, total) SELECT 'p' || g, 0"
            " FROM generate_series(1, 70) g RETURNING id"
        ).fetchall()
        made = leaseq.Queue(conn).enqueue_graph(ocr_graph(2, name="live"))
    ids = sorted([r[0] for r in rows] + [made.pipeline_id], reverse=True)
    client: TestClient = client_for(console_db.admin_url)
    first = client.get("/pipelines").text
    assert _ids(first, "data-pipeline") == ids[:50]
    href = first.split('id="older"')[0].rsplit('href="', 1)[1].split('"')[0]
    assert "before=" in href and "offset" not in href.lower()
    second = client.get(href.replace("&amp;", "&")).text
    assert _ids(second, "data-pipeline") == ids[50:]
    assert 'id="older"' not in second
    unfinished = client.get("/pipelines", params={"unfinished": "1"}).text
    assert made.pipeline_id in _ids(unfinished, "data-pipeline")


def test_a_pipeline_page_shows_its_counters_and_jobs(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        made = q.enqueue_graph(ocr_graph(3))
        done = q.claim(["ocr"], owner="w-1", lease_seconds=30, job_types=["page"])[0]
        q.complete(done.lease, {"text": "ok"})
        running = q.claim(["ocr"], owner="w-2", lease_seconds=30, job_types=["page"])[0]
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/pipelines/{made.pipeline_id}").text
    counters = {
        k: page.split(f'id="count-{k}">')[1].split("<")[0]
        for k in ("total", "succeeded", "dead", "cancelled", "unfinished")
    }
    assert counters == {
        "total": "5",
        "succeeded": "1",
        "dead": "0",
        "cancelled": "0",
        "unfinished": "4",
    }
    shown = _ids(page.split('id="pipeline-jobs"')[1].split("</table>")[0], "data-job")
    assert shown == sorted(made[k] for k in ("page-0", "page-1", "page-2", "merge", "embed"))
    assert f'<tr data-job="{done.id}">' in page and "status-succeeded" in page
    assert "w-2" in page and running.id in shown
    assert 'id="cancel-pipeline"' in page
    assert client.get("/pipelines/999999").status_code == 404


def test_a_pipeline_page_pages_its_jobs(console_db: ConsoleDb, client_for) -> None:
    """Keyset pages of all its jobs, finished or not, in id order."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        made = leaseq.Queue(conn).enqueue_graph(ocr_graph(130))
        conn.execute(
            "UPDATE leaseq.jobs SET status = 'succeeded', finished_at = now()"
            " WHERE pipeline_id = %s AND job_type = 'page' AND id < %s",
            (made.pipeline_id, made["page-25"]),
        )
    every = [made[f"page-{n}"] for n in range(130)] + [made["merge"], made["embed"]]
    client: TestClient = client_for(console_db.admin_url)
    first = client.get(f"/pipelines/{made.pipeline_id}").text
    assert _jobs(first) == every[:100]
    href = first.split('id="more-jobs"')[0].rsplit('href="', 1)[1].split('"')[0]
    second = client.get(href).text
    assert _jobs(second) == every[100:]
    assert 'id="more-jobs"' not in second


def _jobs(page: str) -> list[int]:
    return _ids(page.split('id="pipeline-jobs"')[1].split("</table>")[0], "data-job")


def test_a_finished_pipeline_lists_its_jobs_and_links_its_dead_one(
    console_db: ConsoleDb, client_for
) -> None:
    """A pipeline finished by a dead page still lists all its jobs, and its dead count links
    to a list of the dead job only."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        g = Graph("doc")
        parts = [
            g.add("ocr", "page", {"page": n}, name=f"page-{n}", max_attempts=1) for n in range(3)
        ]
        g.add("ocr", "merge", name="merge", after=parts)
        made = q.enqueue_graph(g)
        for n in range(3):
            claimed = q.claim(["ocr"], owner="w-1", lease_seconds=30, job_types=["page"])[0]
            if n == 1:
                q.fail(claimed.lease, "bad scan", retryable=False, error_code="scan")
                dead = claimed.id
            else:
                q.complete(claimed.lease, {"text": "ok"})
        assert q.pipeline(made.pipeline_id).finished
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/pipelines/{made.pipeline_id}").text
    assert 'id="pipeline-state">finished' in page
    assert _jobs(page) == sorted(made[k] for k in ("page-0", "page-1", "page-2", "merge"))
    href = page.split('id="dead-jobs-link"')[0].rsplit('href="', 1)[1].split('"')[0]
    dead_page = client.get(href).text
    assert _jobs(dead_page) == [dead]
    assert 'id="more-jobs"' not in dead_page
    assert client.get(f"/pipelines/{made.pipeline_id}?status=nope").status_code == 400


def test_a_status_filter_looks_at_one_window_of_a_pipeline_at_a_time(console_db: ConsoleDb) -> None:
    """A rare status costs a window of the pipeline's jobs per page, and the cursor goes on
    after that window, so every match is reached."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        made = leaseq.Queue(conn).enqueue_graph(ocr_graph(30))
        conn.execute(
            "UPDATE leaseq.jobs SET status = 'dead', finished_at = now() WHERE id = ANY(%s)",
            ([made["page-3"], made["page-25"]],),
        )
    found, after, pages = [], 0, 0
    with leaseq.connect(console_db.admin_url, action="test") as conn:
        console = Console(conn)
        while after is not None and pages < 10:
            _, jobs = console.pipeline(
                made.pipeline_id, after=after, status=JobStatus.DEAD, window=10
            )
            found += [r["id"] for r in jobs.rows]
            after, pages = jobs.next_after, pages + 1
    # 32 jobs, 10 looked at per page: the fourth page looks at the last 2.
    assert pages == 4
    assert found == [made["page-3"], made["page-25"]]


def _state(conn: psycopg.Connection[Any], ids: list[int]) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT j.status::text, j.last_error_code, j.finished_at IS NOT NULL,"
        " j.lease_expires_at IS NULL, j.last_error,"
        " (SELECT array_agg(a.outcome::text ORDER BY a.lease_token) FROM leaseq.job_attempts a"
        "   WHERE a.job_id = j.id)"
        " FROM unnest(%s::bigint[]) WITH ORDINALITY AS x(id, n)"
        " JOIN leaseq.jobs j ON j.id = x.id ORDER BY x.n",
        (ids,),
    ).fetchall()
    return [tuple(r) for r in rows]


def test_cancel_pipeline_cancels_what_the_cli_cancels_and_is_audited(
    console_db: ConsoleDb, client_for
) -> None:
    keys = ["page-0", "page-1", "page-2", "merge", "embed"]
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        states = {}
        for name in ("console", "cli"):
            made = q.enqueue_graph(ocr_graph(3, name=name, queue=name))
            first = q.claim([name], owner=f"w-{name}", lease_seconds=30, job_types=["page"])[0]
            q.complete(first.lease, {"ok": True})
            running = q.claim([name], owner=f"w-{name}", lease_seconds=30, job_types=["page"])[0]
            states[name] = (made, running)
    console_made, console_running = states["console"]
    cli_made, cli_running = states["cli"]
    client: TestClient = client_for(console_db.admin_url)
    answer = post(
        client, f"/pipelines/{console_made.pipeline_id}/cancel", {"reason": "user gave up"}
    )
    assert answer.status_code == 200, answer.text
    assert "4 job(s) cancelled (1 of them running" in answer.text
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        done = q.cancel_pipeline(cli_made.pipeline_id, reason="user gave up")
        assert (done.cancelled, done.running) == (4, 1)
        # The same jobs in the same states, columns and attempt records as the CLI's cancel;
        # the reasons say who cancelled.
        console_state = _state(conn, [console_made[k] for k in keys])
        cli_state = _state(conn, [cli_made[k] for k in keys])
        assert [s[:4] + s[5:] for s in console_state] == [s[:4] + s[5:] for s in cli_state]
        why = "cancelled with pipeline {}{}: user gave up"
        assert [s[4] for s in console_state[1:]] == [
            why.format(console_made.pipeline_id, " by console user local")
        ] * 4
        assert [s[4] for s in cli_state[1:]] == [why.format(cli_made.pipeline_id, "")] * 4
        # The running holder is fenced.
        assert isinstance(q.complete(console_running.lease, {}), leaseq.Fenced)
        a, b = (q.pipeline(m.pipeline_id) for m in (console_made, cli_made))
        assert (a.succeeded, a.cancelled, a.finished) == (b.succeeded, b.cancelled, b.finished)
        assert (a.succeeded, a.cancelled, a.finished) == (1, 4, True)
        audit = conn.execute(
            "SELECT actor, db_role, action, job_ids, asked, reason, filter"
            " FROM leaseq.console_audit"
        ).fetchall()
    cancelled = sorted(console_made[k] for k in keys[1:])
    assert audit == [
        (
            "local",
            console_db.admin_role,
            "cancel_pipeline",
            cancelled,
            4,
            "user gave up",
            {"pipeline_id": console_made.pipeline_id},
        )
    ]
    shown = client.get("/audit").text
    assert "cancel_pipeline" in shown and "4 of 4" in shown
    after = client.get(f"/pipelines/{console_made.pipeline_id}").text
    assert 'id="cancel-pipeline"' not in after
    assert _jobs(after) == sorted(console_made[k] for k in keys)
    shown_why = after.split(f'data-job="{console_made["merge"]}"')[1].split("</tr>")[0]
    assert "PIPELINE_CANCELLED" in shown_why
    assert why.format(console_made.pipeline_id, " by console user local") in shown_why
    merge_page = client.get(f"/jobs/{console_made['merge']}").text
    assert why.format(console_made.pipeline_id, " by console user local") in merge_page
    del cli_running


def test_a_read_only_role_is_refused_the_pipeline_cancel(console_db: ConsoleDb, client_for) -> None:
    grant_readonly(console_db)
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        made = leaseq.Queue(conn).enqueue_graph(ocr_graph(2))
    client: TestClient = client_for(console_db.readonly_url)
    page = client.get(f"/pipelines/{made.pipeline_id}").text
    assert 'id="read-only"' in page
    answer = post(client, f"/pipelines/{made.pipeline_id}/cancel", {"reason": "try"})
    assert answer.status_code == 403, answer.text
    assert "Refused by the database" in answer.text
    assert "permission denied for function console_cancel_pipeline." in answer.text
    with psycopg.connect(console_db.owner_url) as conn:
        statuses = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'cancelled') FROM leaseq.jobs"
        ).fetchone()
        assert statuses == (0,)
        assert conn.execute("SELECT count(*) FROM leaseq.console_audit").fetchone() == (0,)
        # The previous console role (the admin one) lost its EXECUTE with the re-grant.
        kept = conn.execute(
            "SELECT has_function_privilege(%s, 'leaseq.console_cancel_pipeline(bigint, text,"
            " text)', 'EXECUTE')",
            (console_db.admin_role,),
        ).fetchone()
        assert kept == (False,)


def test_the_console_role_reads_but_cannot_write_pipelines(console_db: ConsoleDb) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        leaseq.Queue(conn).enqueue_graph(ocr_graph(1))
    with psycopg.connect(console_db.admin_url) as conn:
        assert conn.execute("SELECT count(*) FROM leaseq.job_deps").fetchone() == (2,)
        for statement in (
            "UPDATE leaseq.pipelines SET cancelled = 0",
            "DELETE FROM leaseq.job_deps",
        ):
            try:
                conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege:
                conn.rollback()
            else:
                raise AssertionError(f"the console role could run {statement}")


def test_a_reason_is_required_to_cancel_a_pipeline(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        made = leaseq.Queue(conn).enqueue_graph(ocr_graph(1))
    client: TestClient = client_for(console_db.admin_url)
    answer = post(client, f"/pipelines/{made.pipeline_id}/cancel", {"reason": " "})
    assert answer.status_code == 400 and "say why" in answer.text


def test_cancelling_an_unknown_pipeline_says_so(console_db: ConsoleDb, client_for) -> None:
    client: TestClient = client_for(console_db.admin_url)
    answer = post(client, "/pipelines/999999/cancel", {"reason": "typo"})
    assert answer.status_code == 400 and "no pipeline 999999" in answer.text
    assert "Traceback" not in answer.text
    with psycopg.connect(console_db.owner_url) as conn:
        assert conn.execute("SELECT count(*) FROM leaseq.console_audit").fetchone() == (0,)


def test_cancel_a_waiting_job_from_its_page(console_db: ConsoleDb, client_for) -> None:
    """As `leaseq cancel` does: the waiting job and its waiting descendants, audited."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        made = leaseq.Queue(conn).enqueue_graph(ocr_graph(2))
    client: TestClient = client_for(console_db.admin_url)
    assert 'id="cancel-form"' in client.get(f"/jobs/{made['merge']}").text
    answer = post(client, f"/jobs/{made['merge']}/cancel", {"reason": "not needed"})
    assert "1 of 1 job(s) cancelled, and 1 unfinished descendant(s)" in answer.text, answer.text
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        assert q.get(made["merge"]).status == "cancelled"
        assert q.get(made["embed"]).status == "cancelled"  # its descendant
        assert q.get(made["page-0"]).status == "pending"
        audit = conn.execute("SELECT action, job_ids FROM leaseq.console_audit").fetchall()
    assert audit == [("cancel", [made["merge"], made["embed"]])]
    embed = client.get(f"/jobs/{made['embed']}").text
    assert f"cancelled with ancestor job {made['merge']} by console user local: not needed" in embed


def test_cancelling_a_finished_root_from_its_page_ends_its_running_descendants(
    console_db: ConsoleDb, client_for
) -> None:
    """A root that spawned and finished: its page offers to cancel what it started, and the
    pages of its descendants and their pipeline say why they ended."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        root = q.enqueue("ocr", "split", {}).job_id
        (split,) = q.claim(["ocr"], owner="w-1", lease_seconds=30)
        g = Graph("pages")
        pages = [g.add("ocr", "page", {"page": n}, name=f"page-{n}") for n in range(2)]
        g.add("ocr", "merge", name="merge", after=pages)
        assert isinstance(q.complete_many([split.lease], spawns=[g])[0], leaseq.Completed)
        (running,) = q.claim(["ocr"], owner="w-1", lease_seconds=30)
        pipeline_id = q.links(running.id, limit=0).pipeline_id
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/jobs/{root}").text
    assert "Cancel its unfinished descendants" in page
    answer = post(client, f"/jobs/{root}/cancel", {"reason": "wrong file"})
    assert "0 of 1 job(s) cancelled, and 3 unfinished descendant(s)" in answer.text, answer.text
    why = f"cancelled with ancestor job {root} by console user local: wrong file"
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        assert isinstance(q.complete(running.lease, {}), leaseq.Fenced)
        [attempt] = q.attempts(running.id)
        assert (attempt.outcome, attempt.error) == ("cancelled", why)
    assert why in client.get(f"/jobs/{running.id}").text
    listed = client.get(f"/pipelines/{pipeline_id}").text
    assert listed.count(why) == 3 and listed.count("ANCESTOR_CANCELLED") == 3


def test_a_finished_pipeline_moved_to_history_still_lists_its_jobs(
    console_db: ConsoleDb, client_for
) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        made = q.enqueue_graph(ocr_graph(2))
        q.cancel_pipeline(made.pipeline_id, reason="not needed")
        history = History(conn)
        soon = db_now(conn) + timedelta(seconds=10)
        history.ensure_partitions(ahead=2, timeout=10, now=soon)
        assert history.move(hot_retention=1, batch=100, timeout=10, now=soon).moved == 4
    client: TestClient = client_for(console_db.admin_url)
    page = client.get(f"/pipelines/{made.pipeline_id}").text
    assert _jobs(page) == sorted(made[k] for k in ("page-0", "page-1", "merge", "embed"))
    assert page.count("(history)") == 4
    assert page.count(f"cancelled with pipeline {made.pipeline_id}: not needed") == 4
