"""Every console page answers whatever a column holds: times at -infinity, infinity and past
year 9999, a 1 MiB payload (support.badrows), and a flood of 200 queues. The job page never
loads a document larger than it shows."""

from __future__ import annotations

from starlette.testclient import TestClient

import leaseq
from support.badrows import BAD, GOOD, MIB, Planted, flood, plant
from support.consoledb import ConsoleDb

PAGES = ["/", "/jobs", f"/jobs?queue={BAD}", "/dead", "/workers", "/pipelines", "/flow",
         f"/flow?queue={BAD}", "/schedules", "/audit"]  # fmt: skip


def _planted(console_db: ConsoleDb) -> Planted:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        return plant(conn)


def test_every_page_answers_with_bad_rows(console_db: ConsoleDb, client_for) -> None:
    planted = _planted(console_db)
    client: TestClient = client_for(console_db.admin_url)
    for page in PAGES:
        answer = client.get(page)
        assert answer.status_code == 200, (page, answer.text)
    overview = client.get("/").text
    assert f'data-queue="{GOOD}"' in overview and f'data-queue="{BAD}"' in overview
    assert "infinity" in client.get(f"/jobs?queue={BAD}").text
    assert "-infinite" in client.get("/workers").text  # started at infinity: no age
    assert "infinity" in client.get(f"/flow?queue={BAD}").text  # paused past 9999
    ids = [*planted.pending.values(), planted.running, planted.dead, planted.good]
    for job_id in ids:
        answer = client.get(f"/jobs/{job_id}")
        assert answer.status_code == 200, (job_id, answer.text)
    waiting = client.get(f"/jobs/{planted.pending['-infinity']}").text
    assert "-infinity" in waiting
    # Waiting since -infinity, for a name of control characters and 5,000 letters.
    assert 'id="waiting-since">-infinity<' in waiting and 'id="waiting-for">approve' in waiting
    answer = client.get(f"/pipelines/{planted.pipeline}")
    assert answer.status_code == 200, answer.text


def test_a_large_payload_is_not_loaded_by_its_page(console_db: ConsoleDb, client_for) -> None:
    planted = _planted(console_db)
    client: TestClient = client_for(console_db.admin_url)
    answer = client.get(f"/jobs/{planted.big}")
    assert answer.status_code == 200, answer.text
    assert 'id="payload-large"' in answer.text
    assert len(answer.content) < MIB // 16
    small = client.get(f"/jobs/{planted.good}").text
    assert 'id="payload-large"' not in small and "&#34;n&#34;: 1" in small


def test_a_flood_of_queues_answers(console_db: ConsoleDb, client_for) -> None:
    _planted(console_db)
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        flood(conn, 200)
    client: TestClient = client_for(console_db.admin_url)
    answer = client.get("/")
    assert answer.status_code == 200, answer.text
    assert 'data-queue="flood-001"' in answer.text
