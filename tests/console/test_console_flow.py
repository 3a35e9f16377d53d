"""The console's Flow page against a real PostgreSQL, as the console's own database role
(admin and read-only): per queue the limits, the keys with work and their units (a limited
key whose units are all held by running jobs is marked saturated), the aggregates blocked by
a dead head (linked to its job page), keyset pages; and no form on the page (read-only)."""

from __future__ import annotations

import leaseq
from leaseq.core.models import SILENT_AFTER_SECONDS
from support.consoledb import ConsoleDb, grant_readonly

Q = "flowq"


def _row(page: str, attribute: str, value: str) -> str:
    assert f'{attribute}="{value}"' in page, page
    return page.split(f'{attribute}="{value}"')[1].split("</tr>")[0]


def _setup(url: str) -> int:
    """Key "tenant-a" limited to 2 with 2 running and 3 ready; key "tenant-b" limited to 5
    with 1 running; an aggregate "order-7" whose head is dead, 2 jobs behind it."""
    with leaseq.connect(url, action="test") as conn:
        q = leaseq.Queue(conn)
        flow = leaseq.FlowControl(conn)
        flow.set_limit(Q, "tenant-a", max_running=2)
        flow.set_limit(Q, "tenant-*", max_running=5, per_second=10.0, burst=3.0, weight=2.0)
        for n in range(5):
            q.enqueue(Q, "work", {"n": n}, key="tenant-a")
        q.enqueue(Q, "work", {}, key="tenant-b")
        running = q.claim([Q], "w", limit=10)
        assert len(running) == 3, "2 of tenant-a (its limit) and 1 of tenant-b"
        ids = [q.enqueue(Q, "step", {"n": n}, ordering_key="order-7").job_id for n in range(3)]
        [head] = q.claim([Q], "w")
        assert head.id == ids[0]
        q.fail(head.lease, "poison", retryable=False)
        return ids[0]


def test_flow_page_shows_limits_saturated_keys_and_blocked_heads(
    console_db: ConsoleDb, client_for
) -> None:
    head = _setup(console_db.owner_url)
    client = client_for(console_db.admin_url)
    assert 'href="/flow" id="nav-flow"' in client.get("/").text
    page = client.get("/flow", params={"queue": Q}).text
    exact = _row(page, "data-limit", f"{Q}/tenant-a")
    assert '<td class="n">2</td>' in exact
    pattern = _row(page, "data-limit", f"{Q}/tenant-*")
    assert ">5<" in pattern and ">10.0<" in pattern and ">3.0<" in pattern and ">2.0<" in pattern
    a = page.split(f'data-key="{Q}/tenant-a"')[1].split("</tr>")[0]
    cells = [c.split("</td>")[0] for c in a.split('<td class="n">')[1:]]
    assert cells[:4] == ["2", "2", "3", "0"], cells  # max running, running, ready, free
    assert "saturated" in a
    assert page.split(f'data-key="{Q}/tenant-a"')[0].rstrip().endswith("<tr"), page
    assert ' class="saturated"' in page.split(f'data-key="{Q}/tenant-a"')[1].split(">")[0]
    b = _row(page, "data-key", f"{Q}/tenant-b")
    cells = [c.split("</td>")[0] for c in b.split('<td class="n">')[1:]]
    assert cells[:4] == ["5", "1", "0", "4"], cells
    assert "saturated" not in b
    blocked = _row(page, "data-aggregate", f"{Q}/order-7")
    assert f'<a href="/jobs/{head}" class="head">{head}</a>' in blocked
    assert blocked.rstrip().endswith('<td class="n">2</td>'), blocked  # waiting behind it
    assert "<form" not in page.split("<h2>Limits</h2>")[1], "the Flow page has no action"
    assert client.get(f"/jobs/{head}").status_code == 200
    other = client.get("/flow", params={"queue": "nothing-here"}).text
    assert 'id="no-limits"' in other and 'id="no-keys"' in other and 'id="no-blocked"' in other


def test_flow_page_pages_by_keyset(console_db: ConsoleDb, client_for) -> None:
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        for n in range(105):
            q.enqueue(Q, "work", {}, key=f"k{n:03d}")
    client = client_for(console_db.admin_url)
    page = client.get("/flow", params={"queue": Q}).text
    first = [x.split('"')[0] for x in page.split(f'data-key="{Q}/')[1:]]
    assert first == [f"k{n:03d}" for n in range(100)]
    more = page.split('id="keys-next"')[0].rsplit('href="', 1)[1].split('"')[0]
    rest = client.get(more.replace("&amp;", "&")).text
    second = [x.split('"')[0] for x in rest.split(f'data-key="{Q}/')[1:]]
    assert second == [f"k{n:03d}" for n in range(100, 105)]
    assert 'id="keys-next"' not in rest


def test_read_only_role_views_the_flow_page(console_db: ConsoleDb, client_for) -> None:
    head = _setup(console_db.owner_url)
    grant_readonly(console_db)
    client = client_for(console_db.readonly_url)
    response = client.get("/flow")
    assert response.status_code == 200, response.text
    assert 'data-key="flowq/tenant-a"' in response.text
    assert f'href="/jobs/{head}"' in response.text


def test_flow_page_shows_who_holds_a_keys_units_and_which_holder_is_silent(
    console_db: ConsoleDb, client_for
) -> None:
    """A limited key's held units, each with its job (linked), worker, since when, whether
    the worker is silent (no heartbeat for SILENT_AFTER_SECONDS, as leaseq status says) and
    when its lease expires; the key counts the units silent workers hold."""
    with leaseq.connect(console_db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        leaseq.FlowControl(conn).set_limit(Q, "tenant-a", max_running=2)
        for n in range(3):
            q.enqueue(Q, "work", {"n": n}, key="tenant-a")
        [live] = q.claim([Q], "w-live", lease_seconds=30)
        [crashed] = q.claim([Q], "w-crashed", lease_seconds=30)
        # w-crashed's last heartbeat is past the silence rule; w-live's is fresh.
        conn.execute(
            "INSERT INTO leaseq.workers (worker_id, queues, concurrency, heartbeat_at)"
            " VALUES ('w-live', %(q)s, 1, now()),"
            " ('w-crashed', %(q)s, 1, now() - make_interval(secs => %(s)s))",
            {"q": [Q], "s": SILENT_AFTER_SECONDS + 30},
        )
        expires = conn.execute(
            "SELECT lease_expires_at FROM leaseq.jobs WHERE id = %s", (crashed.id,)
        ).fetchone()[0]
    client = client_for(console_db.admin_url)
    page = client.get("/flow", params={"queue": Q}).text
    key = _row(page, "data-key", f"{Q}/tenant-a")
    assert 'data-held-silent="1"' in key
    holders = page.split('id="flow-holders"')[1].split("</table>")[0]
    order = [int(x.split('"')[0]) for x in holders.split('data-holder="')[1:]]
    assert order == [crashed.id, live.id], "the silent holder first"
    gone = _row(holders, "data-holder", str(crashed.id))
    assert f'<a href="/jobs/{crashed.id}">{crashed.id}</a>' in gone
    assert "w-crashed" in gone and ">silent</strong>" in gone
    assert expires.strftime("%Y-%m-%d %H:%M:%S") in gone
    fine = _row(holders, "data-holder", str(live.id))
    assert "w-live" in fine and "silent" not in fine
    assert client.get(f"/jobs/{crashed.id}").status_code == 200
