"""The console in a real headless Chromium (Debian's, driven by Playwright; no browser is
downloaded): load the overview, filter the jobs, open a dead job, retry it, and see a real
worker process make it succeed; open a pipeline, a job of it, and cancel the pipeline; follow
a finished pipeline's dead count to its dead job; see a silent worker's held unit on the Flow
page; open a job stopped at an uncertain step and settle it with its result; a read-only
console role gets a clear refusal in the page.
A screenshot of each page is written under the test's tmp path (and LEASEQ_ARTIFACTS_DIR
when set)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import leaseq
from support import badrows
from support.consoledb import ConsoleDb, grant_readonly, make_dead
from support.consoleserver import ConsoleProcess
from support.dbtime import claim_one
from support.polling import wait_for
from support.steps import context, stop_uncertain
from support.workers import Workers

pytestmark = pytest.mark.process

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PROCESS_APPS = Path(__file__).resolve().parents[1] / "process"


def _browser() -> Any:
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            "no chromium: scripts/fetch-tools.sh installs Debian's (apt-get install chromium)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install 'leaseq[test]')")
    return sync_playwright


@pytest.fixture
def artifacts(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "screenshots"
    folder.mkdir()
    yield folder
    extra = os.environ.get("LEASEQ_ARTIFACTS_DIR")
    if extra:
        dest = Path(extra) / "console"
        dest.mkdir(parents=True, exist_ok=True)
        for shot in folder.glob("*.png"):
            shutil.copy(shot, dest / shot.name)


def test_retry_a_dead_job_in_a_real_browser(
    console_db: ConsoleDb, tmp_path: Path, artifacts: Path
) -> None:
    sync_playwright = _browser()
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        for i in range(5):
            q.enqueue("ocr", "work", {"seconds": 0, "doc": i}, delay=3600)
        [dead_id] = make_dead(conn, "ocr", "work", 1, "E_SCANNER")
        make_dead(conn, "mail", "send", 2, "E_SMTP")
    workers = Workers(console_db.owner_url, tmp_path, pythonpath=[PROCESS_APPS])
    console = ConsoleProcess(console_db.admin_url, tmp_path / "console.log", "--refresh", "1")
    try:
        workers.start(
            "w-browser", "--app", "apps:registry", "--queue", "ocr", "--poll-seconds", "0.5"
        )
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(console.base + "/")
            page.wait_for_selector('tr[data-queue="ocr"]')
            assert page.locator('tr[data-queue="mail"]').count() == 1
            page.screenshot(path=artifacts / "overview.png", full_page=True)

            page.click("#nav-jobs")
            page.fill('input[name="queue"]', "ocr")
            page.select_option('select[name="status"]', "dead")
            page.click("#apply-filters")
            page.wait_for_url("**/jobs?*status=dead*")
            rows = page.locator("tr[data-job]")
            assert rows.count() == 1
            page.screenshot(path=artifacts / "jobs-filtered.png", full_page=True)

            page.click(f'tr[data-job="{dead_id}"] a')
            page.wait_for_selector("#retry")
            assert page.inner_text("#job-status") == "dead"
            payload = page.inner_text("#payload")
            assert "sk-live-123" not in payload and "***" in payload
            page.screenshot(path=artifacts / "job-dead.png", full_page=True)

            page.fill('#retry-form input[name="reason"]', "scanner fixed")
            page.click("#retry")
            page.wait_for_selector("#done")
            assert "1 of 1 job(s) retried" in page.inner_text("#done")
            page.screenshot(path=artifacts / "retried.png", full_page=True)

            def succeeded() -> bool:
                page.goto(f"{console.base}/jobs/{dead_id}")
                return page.inner_text("#job-status") == "succeeded"

            wait_for(succeeded, "the retried job to succeed on the real worker")
            assert "w-browser" in page.inner_text("#attempts")
            page.screenshot(path=artifacts / "job-succeeded.png", full_page=True)

            page.goto(console.base + "/dead")
            page.screenshot(path=artifacts / "dead.png", full_page=True)
            for name in ("workers", "schedules", "audit", "pools"):
                page.goto(f"{console.base}/{name}")
                page.screenshot(path=artifacts / f"{name}.png", full_page=True)
            page.goto(console.base + "/audit")
            assert "scanner fixed" in page.inner_text("#audit")
            browser.close()
    finally:
        console.stop()
        workers.stop_all()
    assert "sk-live-123" not in console.log.read_text()


def test_a_job_stopped_at_an_uncertain_step_in_a_real_browser(
    console_db: ConsoleDb, tmp_path: Path, artifacts: Path
) -> None:
    sync_playwright = _browser()
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        job = q.enqueue("q", "agent", {}).job_id
        first = context(q, claim_one(q))
        first.step("draft", lambda: {"words": 812, "token": "sk-live-9"})
        stop_uncertain(q, conn, first, "publish")
    console = ConsoleProcess(console_db.admin_url, tmp_path / "console.log", "--refresh", "1")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{console.base}/jobs/{job}")
            assert page.inner_text("#job-status") == "held"
            assert page.locator("#job-steps tr[data-step]").count() == 2
            draft = page.inner_text('#job-steps tr[data-step="draft"]')
            assert "recorded" in draft and "812" in draft and "sk-live-9" not in draft
            assert "uncertain" in page.inner_text('#job-steps tr[data-step="publish"]')
            assert page.inner_text("#uncertain-step") == "publish"
            command = page.inner_text("#resolve-command")
            assert f"leaseq steps resolve {job} publish --retry" in command
            page.screenshot(path=artifacts / "job-step-uncertain.png", full_page=True)

            # Not JSON: the page says so and nothing is written.
            page.fill("#resolve-result", "{url: 'https://blog.example/p/1'}")
            page.fill("#resolve-reason", "published, checked the blog")
            page.click("#resolve-result-button")
            page.wait_for_selector("#refusal")
            assert "invalid result: is not JSON" in page.inner_text("#refusal")
            page.screenshot(path=artifacts / "job-step-bad-json.png", full_page=True)
            page.go_back()

            page.fill("#resolve-result", '{"url": "https://blog.example/p/1"}')
            page.fill("#resolve-reason", "published, checked the blog")
            page.click("#resolve-result-button")
            page.wait_for_selector("#done")
            assert "1 of 1 job(s) resumed (step 'publish' recorded)" in page.inner_text("#done")
            page.screenshot(path=artifacts / "job-step-resolved.png", full_page=True)
            page.click("#back")
            page.wait_for_selector("#job-steps")
            assert page.inner_text("#job-status") == "pending"
            assert page.locator("#resolve-step-form").count() == 0
            publish = page.inner_text('#job-steps tr[data-step="publish"]')
            assert "recorded, resolved by local" in publish and "blog.example/p/1" in publish
            page.goto(console.base + "/audit")
            assert "published, checked the blog" in page.inner_text("#audit")
            browser.close()
    finally:
        console.stop()
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        [step] = [s for s in leaseq.Queue(conn).steps(job) if s.name == "publish"]
    assert step.result == {"url": "https://blog.example/p/1"} and step.resolved_by == "local"


def test_a_read_only_console_refuses_in_the_page(
    console_db: ConsoleDb, tmp_path: Path, artifacts: Path
) -> None:
    sync_playwright = _browser()
    grant_readonly(console_db)
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        [dead_id] = make_dead(conn, "ocr", "work", 1, "E_SCANNER")
    console = ConsoleProcess(console_db.readonly_url, tmp_path / "console.log", "--refresh", "1")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{console.base}/jobs/{dead_id}")
            assert "Read-only console" in page.inner_text("#read-only")
            page.fill('#retry-form input[name="reason"]', "try anyway")
            page.click("#retry")
            page.wait_for_selector("#refusal")
            text = page.inner_text("main")
            assert "Refused by the database" in text and "read-only" in text
            assert "Traceback" not in page.content()
            page.screenshot(path=artifacts / "read-only-refusal.png", full_page=True)
            browser.close()
    finally:
        console.stop()
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        assert leaseq.Queue(conn).get(dead_id).status == "dead"


def test_open_and_cancel_a_pipeline_in_a_real_browser(
    console_db: ConsoleDb, tmp_path: Path, artifacts: Path
) -> None:
    """The overview's waiting count, the pipelines list, a pipeline's counters and jobs, a
    job's parents and its link back to the pipeline, then "cancel pipeline" with a reason."""
    sync_playwright = _browser()
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        g = leaseq.Graph("invoice-412")
        pages = [g.add("ocr", "ocr.page", {"page": n}, name=f"page-{n}") for n in range(3)]
        merge = g.add("ocr", "ocr.merge", name="merge", after=pages)
        g.add("ocr", "embed", name="embed", after=[merge])
        made = q.enqueue_graph(g)
        done = q.claim(["ocr"], owner="w-1", lease_seconds=60, job_types=["ocr.page"])[0]
        q.complete(done.lease, {"text": "ok"})
        q.claim(["ocr"], owner="w-2", lease_seconds=60, job_types=["ocr.page"])
    console = ConsoleProcess(console_db.admin_url, tmp_path / "console.log", "--refresh", "1")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(console.base + "/")
            row = page.locator('tr[data-queue="ocr"]')
            assert row.locator("a[href*='status=waiting']").inner_text() == "2"
            page.click("#nav-pipelines")
            page.wait_for_selector(f'tr[data-pipeline="{made.pipeline_id}"]')
            page.screenshot(path=artifacts / "pipelines.png", full_page=True)
            page.click(f'tr[data-pipeline="{made.pipeline_id}"] a')
            page.wait_for_selector("#pipeline-counters")
            assert page.inner_text("#count-total") == "5"
            assert page.inner_text("#count-succeeded") == "1"
            assert page.inner_text("#count-unfinished") == "4"
            # All its jobs, the succeeded one too.
            assert page.locator("#pipeline-jobs tr[data-job]").count() == 5
            assert page.locator("#pipeline-jobs td.status-succeeded").count() == 1
            page.screenshot(path=artifacts / "pipeline.png", full_page=True)

            page.click(f'#pipeline-jobs tr[data-job="{made["merge"]}"] a')
            page.wait_for_selector("#job-parents")
            assert page.locator("#job-parents tr[data-link]").count() == 3
            assert page.inner_text("#job-status") == "waiting"
            page.screenshot(path=artifacts / "job-in-pipeline.png", full_page=True)
            page.click("#job-pipeline-link")
            page.wait_for_selector("#cancel-pipeline-form")
            page.fill('#cancel-pipeline-form input[name="reason"]', "customer withdrew")
            page.click("#cancel-pipeline")
            page.wait_for_selector("#done")
            assert "4 job(s) cancelled (1 of them running" in page.inner_text("#done")
            page.screenshot(path=artifacts / "pipeline-cancelled.png", full_page=True)
            page.click("#back")
            page.wait_for_selector("#pipeline-counters")
            assert page.inner_text("#count-cancelled") == "4"
            assert page.inner_text("#pipeline-state") == "finished"
            # Each cancelled job says why, on the pipeline's page and on its own.
            why = page.inner_text(f'#pipeline-jobs tr[data-job="{made["merge"]}"] td.why')
            assert f"cancelled with pipeline {made.pipeline_id} by console user" in why
            assert why.endswith(": customer withdrew"), why
            page.click(f'#pipeline-jobs tr[data-job="{made["merge"]}"] a')
            page.wait_for_selector("#job-status")
            assert "customer withdrew" in page.inner_text("main")
            page.goto(console.base + "/audit")
            assert "customer withdrew" in page.inner_text("#audit")
            browser.close()
    finally:
        console.stop()


def test_a_finished_pipelines_dead_job_in_a_real_browser(
    console_db: ConsoleDb, tmp_path: Path, artifacts: Path
) -> None:
    """A pipeline finished by a dead job lists its jobs; its dead count is a link to them."""
    sync_playwright = _browser()
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        g = leaseq.Graph("invoice-413")
        g.add("ocr", "ocr.page", {"page": 0}, name="page-0", max_attempts=1)
        g.add("ocr", "ocr.page", {"page": 1}, name="page-1", max_attempts=1)
        made = q.enqueue_graph(g)
        first, second = q.claim(["ocr"], owner="w-1", lease_seconds=60, limit=2)
        q.complete(first.lease, {"text": "ok"})
        q.fail(second.lease, "unreadable scan", retryable=False, error_code="scan")
    console = ConsoleProcess(console_db.admin_url, tmp_path / "console.log", "--refresh", "1")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{console.base}/pipelines/{made.pipeline_id}")
            page.wait_for_selector("#pipeline-counters")
            assert page.inner_text("#pipeline-state") == "finished"
            assert page.locator("#pipeline-jobs tr[data-job]").count() == 2
            page.click("#dead-jobs-link")
            page.wait_for_selector("#all-jobs")
            rows = page.locator("#pipeline-jobs tr[data-job]")
            assert rows.count() == 1
            assert rows.first.get_attribute("data-job") == str(second.id)
            page.screenshot(path=artifacts / "pipeline-dead.png", full_page=True)
            page.click(f'#pipeline-jobs tr[data-job="{second.id}"] a')
            page.wait_for_selector("#job-status")
            assert page.inner_text("#job-status") == "dead"
            browser.close()
    finally:
        console.stop()


def test_held_units_and_their_silent_holder_in_a_real_browser(
    console_db: ConsoleDb, tmp_path: Path, artifacts: Path
) -> None:
    """The Flow page names the job and the silent worker holding a limited key's unit, and
    links to the job."""
    sync_playwright = _browser()
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        leaseq.FlowControl(conn).set_limit("flowq", "tenant-a", max_running=1)
        q.enqueue("flowq", "work", {}, key="tenant-a")
        q.enqueue("flowq", "work", {}, key="tenant-a")
        [held] = q.claim(["flowq"], "w-crashed", lease_seconds=60)
        conn.execute(
            "INSERT INTO leaseq.workers (worker_id, queues, concurrency, heartbeat_at)"
            " VALUES ('w-crashed', '{flowq}', 1, now() - interval '10 minutes')"
        )
    console = ConsoleProcess(console_db.admin_url, tmp_path / "console.log", "--refresh", "1")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(console.base + "/")
            page.click("#nav-flow")
            row = page.locator(f'#flow-holders tr[data-holder="{held.id}"]')
            row.wait_for()
            assert "w-crashed" in row.inner_text() and "silent" in row.inner_text()
            assert page.locator('#flow-keys [data-held-silent="1"]').count() == 1
            page.screenshot(path=artifacts / "flow-holders.png", full_page=True)
            row.locator("a").click()
            page.wait_for_selector("#job-status")
            assert page.inner_text("#job-status") == "running"
            browser.close()
    finally:
        console.stop()


# Counts the page's refreshes (each is one fetch of the page) and lets the test hide the tab.
COUNT_FETCHES = """
window.__fetches = 0;
const realFetch = window.fetch.bind(window);
window.fetch = (...args) => { window.__fetches += 1; return realFetch(...args); };
let hidden = false;
Object.defineProperty(document, "visibilityState", {get: () => hidden ? "hidden" : "visible"});
window.__setHidden = (value) => {
  hidden = value;
  document.dispatchEvent(new Event("visibilitychange"));
};
"""


def test_refresh_pauses_in_a_hidden_tab(console_db: ConsoleDb, tmp_path: Path) -> None:
    """The overview refreshes every second (--refresh 1) while visible, sends nothing while
    hidden, and refreshes at once when shown again; the page's clock is Playwright's fake
    one, so no test time passes waiting."""
    sync_playwright = _browser()
    console = ConsoleProcess(console_db.admin_url, tmp_path / "console.log", "--refresh", "1")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.add_init_script(COUNT_FETCHES)
            page.clock.install()
            page.goto(console.base + "/")
            fetches = lambda: page.evaluate("window.__fetches")  # noqa: E731
            page.clock.run_for(3500)
            visible = fetches()
            assert visible >= 3
            page.evaluate("window.__setHidden(true)")
            page.clock.run_for(60_000)
            assert fetches() == visible  # a minute hidden: not one query
            page.evaluate("window.__setHidden(false)")
            assert fetches() == visible + 1  # shown again: refreshed at once
            page.clock.run_for(2500)
            assert fetches() >= visible + 3
            browser.close()
    finally:
        console.stop()


def test_pages_with_unreadable_times_and_a_large_payload_render(
    console_db: ConsoleDb, tmp_path: Path, artifacts: Path
) -> None:
    """Rows holding -infinity, infinity, a year past 9999 and a 1 MiB payload
    (support.badrows): the overview, the jobs, a job due at -infinity, the large job and the
    workers render in the browser, the large payload said to be too large, not shown."""
    sync_playwright = _browser()
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        planted = badrows.plant(conn)
    console = ConsoleProcess(console_db.admin_url, tmp_path / "console.log", "--refresh", "1")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(console.base + "/")
            page.wait_for_selector(f'tr[data-queue="{badrows.BAD}"]')
            assert page.locator(f'tr[data-queue="{badrows.GOOD}"]').count() == 1
            page.screenshot(path=artifacts / "bad-overview.png", full_page=True)
            page.goto(f"{console.base}/jobs?queue={badrows.BAD}")
            assert page.locator("tr[data-job]").count() >= 5
            assert "infinity" in page.inner_text("main")
            page.goto(f"{console.base}/jobs/{planted.pending['-infinity']}")
            assert "-infinity" in page.inner_text("#job-fields")
            # Waiting since -infinity for a 5,000-character name: the section still reads.
            assert page.inner_text("#waiting-since") == "-infinity"
            assert page.inner_text("#waiting-for").startswith("approve")
            assert page.locator("#signal-command").is_visible()
            page.screenshot(path=artifacts / "bad-job-waiting.png", full_page=True)
            page.goto(f"{console.base}/jobs/{planted.big}")
            assert "Too large to show" in page.inner_text("#payload-large")
            assert page.locator("#payload").count() == 0
            page.screenshot(path=artifacts / "bad-job-large.png", full_page=True)
            page.goto(console.base + "/workers")
            assert "w-bad" in page.inner_text("main")
            page.screenshot(path=artifacts / "bad-workers.png", full_page=True)
            browser.close()
    finally:
        console.stop()
