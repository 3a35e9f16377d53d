"""Who may open the console and post its forms: auth modes, Origin and CSRF checks; what a
page may show of a payload (the redaction hook); no secret in a page or a log line."""

from __future__ import annotations

import argparse
import base64
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

import leaseq
from leaseq.console import BasicAuth, LocalOnly, ProxyAuth, create_app
from leaseq.console.settings import ConsoleSettings
from leaseq.console.throttle import FailedLogins
from leaseq.core.errors import ConfigError
from support.consoledb import ConsoleDb, grant_readonly, make_dead, post
from support.dbtime import claim_one
from support.steps import context, stop_uncertain

LOCAL = ("127.0.0.1", 50000)
BASE = "http://127.0.0.1:8089"  # what a browser on this machine sends as Host
REMOTE = ("10.1.2.3", 50000)


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _dead_job(db: ConsoleDb, payload_secret: str = "sk-live-123") -> int:
    with leaseq.connect(db.owner_url, action="test") as conn:
        return make_dead(conn, "ocr", "page", 1, "E")[0]


def _status(db: ConsoleDb, job_id: int) -> str:
    with psycopg.connect(db.owner_url) as conn:
        row = conn.execute("SELECT status FROM leaseq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


# -- authentication ------------------------------------------------------------------------


def test_no_auth_answers_only_loopback(console_db: ConsoleDb) -> None:
    with TestClient(create_app(console_db.admin_url, auth=LocalOnly()), client=REMOTE) as remote:
        answer = remote.get("/")
        assert answer.status_code == 403 and "only this machine" in answer.text
    with TestClient(create_app(console_db.admin_url), client=LOCAL, base_url=BASE) as local:
        assert local.get("/").status_code == 200


def test_no_auth_refuses_a_rebound_host_name(console_db: ConsoleDb) -> None:
    """DNS rebinding: another site's name pointed at 127.0.0.1 reaches a loopback console
    from the victim's browser, same-origin with itself; the Host header is refused."""
    with TestClient(
        create_app(console_db.admin_url), client=LOCAL, base_url="http://evil.example:8089"
    ) as client:
        answer = client.get("/")
        assert answer.status_code == 403 and "loopback" in answer.text
    for base in ("http://127.0.0.1:8089", "http://localhost:8089", "http://[::1]:8089"):
        with TestClient(create_app(console_db.admin_url), client=LOCAL, base_url=base) as ok:
            assert ok.get("/").status_code == 200, base


def test_no_auth_is_refused_on_a_public_address() -> None:
    args = argparse.Namespace(
        database_url="postgresql://console@db/app", address="0.0.0.0", auth="none"
    )
    with pytest.raises(ConfigError, match="not loopback"):
        ConsoleSettings.from_args(args, environ={})
    args.auth = "basic"
    with pytest.raises(ConfigError, match="basic-auth-file"):
        ConsoleSettings.from_args(args, environ={})
    env = {"LEASEQ_CONSOLE_USERNAME": "ann", "LEASEQ_CONSOLE_PASSWORD": "pw"}
    assert ConsoleSettings.from_args(args, environ=env).basic_users == {"ann": "pw"}


def test_a_trusted_proxy_that_is_no_address_is_refused_at_start_up() -> None:
    args = argparse.Namespace(database_url="postgresql://console@db/app", auth="basic")
    env = {
        "LEASEQ_CONSOLE_USERNAME": "ann",
        "LEASEQ_CONSOLE_PASSWORD": "pw",
        "LEASEQ_CONSOLE_TRUSTED_PROXY": "10.0.0.0/8,ingress-nginx",
    }
    with pytest.raises(ConfigError, match="'ingress-nginx' is not an address or network"):
        ConsoleSettings.from_args(args, environ=env)
    env["LEASEQ_CONSOLE_TRUSTED_PROXY"] = "10.0.0.0/8, fd00::/8"
    assert ConsoleSettings.from_args(args, environ=env).trusted_proxy == ("10.0.0.0/8", "fd00::/8")


def test_basic_auth(console_db: ConsoleDb, tmp_path: Path) -> None:
    secret = tmp_path / "users"
    secret.write_text("# a mounted Secret\nann:correct horse\n")
    app = create_app(console_db.admin_url, auth=BasicAuth.from_file(secret))
    with TestClient(app, client=REMOTE) as client:
        anonymous = client.get("/")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith("Basic")
        assert client.get("/", headers=_basic("ann", "wrong")).status_code == 401
        assert client.get("/", headers=_basic("bob", "correct horse")).status_code == 401
        good = client.get("/", headers=_basic("ann", "correct horse"))
        assert good.status_code == 200 and "signed in as ann" in good.text
        assert "correct horse" not in good.text
        assert client.get("/healthz").status_code == 200  # probes need no credentials


def test_only_the_exact_health_path_skips_authentication(console_db: ConsoleDb) -> None:
    """/healthz answers probes without credentials; a path merely ending in /healthz is a
    page or a form post like any other, so it is authenticated (and Origin-checked)."""
    app = create_app(console_db.admin_url, auth=BasicAuth({"ann": "pw"}))
    with TestClient(app, client=REMOTE) as client:
        assert client.get("/healthz").status_code == 200
        for path in ("/x/healthz", "/jobs/1/healthz", "/healthz/", "//healthz"):
            assert client.get(path).status_code == 401, path
            assert client.post(path, data={"reason": "x"}).status_code == 401, path
    mounted = Starlette(routes=[Mount("/leaseq", app=app)])
    with TestClient(mounted, client=REMOTE) as client:
        assert client.get("/leaseq/healthz").status_code == 200
        assert client.get("/leaseq/x/healthz").status_code == 401


class Clock:
    """Time the throttle reads, moved by the test (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failed_sign_ins_are_throttled_and_logged(
    console_db: ConsoleDb, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="leaseq.console")
    clock = Clock()
    auth = BasicAuth({"ann": "correct horse"}, failures=FailedLogins(clock=clock))
    app = create_app(console_db.admin_url, auth=auth)
    with TestClient(app, client=REMOTE) as client:
        for n in range(5):
            assert client.get("/", headers=_basic("ann", f"guess-{n}")).status_code == 401
        refused = client.get("/", headers=_basic("ann", "correct horse"))
        assert refused.status_code == 429 and "too many failed sign-ins" in refused.text
        assert refused.headers["retry-after"] == "60"
        # Not entered: leaving it would run the app's shutdown and close its pool.
        elsewhere = TestClient(app, client=("10.9.9.9", 40000))
        assert elsewhere.get("/", headers=_basic("ann", "correct horse")).status_code == 200
        clock.now += 61
        assert client.get("/", headers=_basic("ann", "correct horse")).status_code == 200
    failures = [r.getMessage() for r in caplog.records if "sign-in failed" in r.getMessage()]
    assert len(failures) == 5
    assert all("'ann'" in line and REMOTE[0] in line for line in failures)
    assert "guess-" not in caplog.text and "correct horse" not in caplog.text
    blocked = [r.getMessage() for r in caplog.records if "sign-ins of" in r.getMessage()]
    assert blocked == [  # once, not per request
        f"console sign-ins of user 'ann' from {REMOTE[0]} refused until 60 s after its first "
        "failure: too many failures"
    ]


def test_basic_auth_actions_are_audited_under_the_user(console_db: ConsoleDb) -> None:
    job_id = _dead_job(console_db)
    app = create_app(console_db.admin_url, auth=BasicAuth({"ann": "pw"}))
    with TestClient(app, client=REMOTE, headers=_basic("ann", "pw")) as client:
        answer = post(client, f"/jobs/{job_id}/retry", {"reason": "fixed"})
        assert answer.status_code == 200, answer.text
    with psycopg.connect(console_db.owner_url) as conn:
        assert conn.execute("SELECT actor FROM leaseq.console_audit").fetchall() == [("ann",)]


def test_proxy_header_only_from_the_trusted_proxy(console_db: ConsoleDb) -> None:
    auth = ProxyAuth("X-Forwarded-User", ["10.1.2.0/24"])
    app = create_app(console_db.admin_url, auth=auth)
    with TestClient(app, client=REMOTE) as proxied:
        assert proxied.get("/").status_code == 401  # the proxy named nobody
        ok = proxied.get("/", headers={"X-Forwarded-User": "carol@example.com"})
        assert ok.status_code == 200 and "carol@example.com" in ok.text
    with TestClient(app, client=("192.0.2.9", 40000)) as forged:
        answer = forged.get("/", headers={"X-Forwarded-User": "carol@example.com"})
        assert answer.status_code == 403 and "trusted proxy" in answer.text


# -- form posts: Origin and CSRF -----------------------------------------------------------


def test_a_post_from_another_origin_is_refused(console_db: ConsoleDb) -> None:
    job_id = _dead_job(console_db)
    with TestClient(create_app(console_db.admin_url), client=LOCAL, base_url=BASE) as client:
        client.get("/")
        token = client.cookies["leaseq_console_csrf"]
        form = {"reason": "x", "csrf": token}
        for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"}, {}):
            answer = client.post(f"/jobs/{job_id}/retry", data=form, headers=headers)
            assert answer.status_code == 403, headers
            assert "another site" in answer.text
        referer = {"Referer": f"{BASE}/jobs/{job_id}"}
        assert client.post(f"/jobs/{job_id}/retry", data=form, headers=referer).status_code == 200
    assert _status(console_db, job_id) == "pending"


def test_a_post_without_the_csrf_token_is_refused(console_db: ConsoleDb) -> None:
    job_id = _dead_job(console_db)
    with TestClient(create_app(console_db.admin_url), client=LOCAL, base_url=BASE) as client:
        client.get("/")
        origin = {"Origin": BASE}
        for form in ({"reason": "x"}, {"reason": "x", "csrf": "forged"}):
            answer = client.post(f"/jobs/{job_id}/retry", data=form, headers=origin)
            assert answer.status_code == 403 and "CSRF" in answer.text
        client.cookies.clear()
        answer = client.post(
            f"/jobs/{job_id}/retry", data={"reason": "x", "csrf": "forged"}, headers=origin
        )
        assert answer.status_code == 403
    assert _status(console_db, job_id) == "dead"
    with psycopg.connect(console_db.owner_url) as conn:
        assert conn.execute("SELECT count(*) FROM leaseq.console_audit").fetchone() == (0,)


def _uncertain_step(db: ConsoleDb) -> tuple[int, dict[str, str]]:
    """A job stopped at its uncertain step, and a complete form settling it."""
    with leaseq.connect(db.owner_url, action="test") as conn:
        q = leaseq.Queue(conn)
        job_id = q.enqueue("q", "agent", {}).job_id
        stop_uncertain(q, conn, context(q, claim_one(q)), "charge")
    return job_id, {"step": "charge", "settle": "result", "result": "1", "reason": "paid"}


def _settled(db: ConsoleDb, job_id: int) -> tuple[object, ...]:
    """The job's status, whether its step was resolved, and how many audit rows exist."""
    with psycopg.connect(db.owner_url) as conn:
        row = conn.execute(
            "SELECT j.status, s.resolved_by IS NOT NULL,"
            " (SELECT count(*) FROM leaseq.console_audit)"
            " FROM leaseq.jobs j JOIN leaseq.job_steps s ON s.job_id = j.id WHERE j.id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_settling_a_step_needs_the_csrf_token_and_the_origin(console_db: ConsoleDb) -> None:
    job_id, form = _uncertain_step(console_db)
    path = f"/jobs/{job_id}/steps/resolve"
    with TestClient(create_app(console_db.admin_url), client=LOCAL, base_url=BASE) as client:
        client.get("/")
        token = client.cookies["leaseq_console_csrf"]
        for data in (form, {**form, "csrf": "forged"}):
            answer = client.post(path, data=data, headers={"Origin": BASE})
            assert answer.status_code == 403 and "CSRF" in answer.text
        answer = client.post(
            path, data={**form, "csrf": token}, headers={"Origin": "https://evil.example"}
        )
        assert answer.status_code == 403 and "another site" in answer.text
        assert _settled(console_db, job_id) == ("held", False, 0)
        answer = client.post(path, data={**form, "csrf": token}, headers={"Origin": BASE})
        assert answer.status_code == 200, answer.text
    assert _settled(console_db, job_id) == ("pending", True, 1)


def test_a_read_only_console_cannot_settle_a_step(console_db: ConsoleDb) -> None:
    """The database refuses the read-only role the function, whoever signed in."""
    grant_readonly(console_db)
    job_id, form = _uncertain_step(console_db)
    app = create_app(console_db.readonly_url, auth=BasicAuth({"ann": "pw"}))
    with TestClient(app, client=REMOTE, headers=_basic("ann", "pw")) as client:
        assert 'id="read-only"' in client.get(f"/jobs/{job_id}").text
        answer = post(client, f"/jobs/{job_id}/steps/resolve", form)
    assert answer.status_code == 403, answer.text
    assert "Refused by the database" in answer.text and "leaseq steps resolve" in answer.text
    assert "permission denied for function console_resolve_step." in answer.text
    assert _settled(console_db, job_id) == ("held", False, 0)
    # Nor by hand: the role may not update the step's row, nor call the function the
    # console's SECURITY DEFINER wraps to write it (no UPDATE on leaseq.job_steps).
    with psycopg.connect(console_db.readonly_url) as conn:
        for sql in (
            "UPDATE leaseq.job_steps SET resolved_by = 'x'",
            "SELECT leaseq.step_resolve(%s, 'charge', '1', false, 'x', 'y', NULL)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.replace("%s", str(job_id)))
            conn.rollback()
    assert _settled(console_db, job_id) == ("held", False, 0)


def test_settling_a_step_is_audited_under_the_signed_in_user(console_db: ConsoleDb) -> None:
    job_id, form = _uncertain_step(console_db)
    app = create_app(console_db.admin_url, auth=BasicAuth({"ann": "pw"}))
    with TestClient(app, client=REMOTE, headers=_basic("ann", "pw")) as client:
        assert post(client, f"/jobs/{job_id}/steps/resolve", form).status_code == 200
    with psycopg.connect(console_db.owner_url) as conn:
        assert conn.execute("SELECT actor FROM leaseq.console_audit").fetchall() == [("ann",)]
        by = conn.execute("SELECT resolved_by FROM leaseq.job_steps WHERE job_id = %s", (job_id,))
        assert by.fetchall() == [("ann",)]


def test_an_allowed_origin_behind_an_ingress(console_db: ConsoleDb) -> None:
    job_id = _dead_job(console_db)
    app = create_app(console_db.admin_url, allowed_origins=["https://leaseq.example.com"])
    with TestClient(app, client=LOCAL, base_url=BASE) as client:
        client.get("/")
        answer = client.post(
            f"/jobs/{job_id}/retry",
            data={"reason": "x", "csrf": client.cookies["leaseq_console_csrf"]},
            headers={"Origin": "https://leaseq.example.com"},
        )
        assert answer.status_code == 200


def test_the_csrf_cookie_is_strict_and_http_only(console_db: ConsoleDb) -> None:
    with TestClient(create_app(console_db.admin_url), client=LOCAL, base_url=BASE) as client:
        cookie = client.get("/").headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert "secure" not in cookie  # plain http on loopback: a Secure cookie would be lost


def test_the_csrf_cookie_is_secure_over_https_or_behind_a_tls_proxy(
    console_db: ConsoleDb,
) -> None:
    app = create_app(console_db.admin_url, auth=BasicAuth({"ann": "pw"}))
    with TestClient(app, client=REMOTE, base_url="https://leaseq.example.com") as client:
        cookie = client.get("/", headers=_basic("ann", "pw")).headers["set-cookie"].lower()
        assert "; secure" in cookie
    app = create_app(console_db.admin_url, auth=BasicAuth({"ann": "pw"}), secure_cookies=True)
    with TestClient(app, client=REMOTE, base_url="http://10.0.0.7:8089") as client:
        cookie = client.get("/", headers=_basic("ann", "pw")).headers["set-cookie"].lower()
        assert "; secure" in cookie
    args = argparse.Namespace(database_url="postgresql://console@db/app")
    env = {"LEASEQ_CONSOLE_BEHIND_HTTPS": "true"}
    assert ConsoleSettings.from_args(args, environ=env).behind_https
    assert not ConsoleSettings.from_args(args, environ={}).behind_https


# -- redaction -----------------------------------------------------------------------------


def _secret_job(db: ConsoleDb) -> int:
    with leaseq.connect(db.owner_url, action="test") as conn:
        job = leaseq.Queue(conn).enqueue(
            "ocr",
            "page",
            {
                "doc": "invoice-7",
                "api_key": "sk-live-123",
                "nested": {"password": "hunter2"},
                "dsn": "postgresql://app:pgpass99@db/app",
            },
        )
    return job.job_id


def test_the_default_redaction_masks_secret_looking_keys(console_db: ConsoleDb) -> None:
    job_id = _secret_job(console_db)
    with TestClient(create_app(console_db.admin_url), client=LOCAL, base_url=BASE) as client:
        page = client.get(f"/jobs/{job_id}").text
    assert "invoice-7" in page
    for secret in ("sk-live-123", "hunter2", "pgpass99"):
        assert secret not in page


def test_a_registered_redaction_hook_decides(console_db: ConsoleDb) -> None:
    job_id = _secret_job(console_db)
    seen: list[tuple[str, str]] = []

    def hook(job_type: str, field: str, value: Any) -> Any:
        seen.append((job_type, field))
        return {"shown": "only this"}

    with TestClient(
        create_app(console_db.admin_url, redact=hook), client=LOCAL, base_url=BASE
    ) as client:
        page = client.get(f"/jobs/{job_id}").text
    assert ("page", "payload") in seen
    assert "only this" in page and "invoice-7" not in page


def test_a_failing_hook_hides_the_value(console_db: ConsoleDb) -> None:
    job_id = _secret_job(console_db)

    def hook(job_type: str, field: str, value: Any) -> Any:
        raise RuntimeError("hook bug")

    with TestClient(
        create_app(console_db.admin_url, redact=hook), client=LOCAL, base_url=BASE
    ) as client:
        page = client.get(f"/jobs/{job_id}").text
    assert "invoice-7" not in page and "hidden" in page


def test_no_secret_reaches_a_log_line(
    console_db: ConsoleDb, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = _secret_job(console_db)
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(console_db.admin_url), client=LOCAL, base_url=BASE) as client:
        for path in ("/", "/jobs", f"/jobs/{job_id}", "/dead", "/workers", "/jobs?status=x"):
            client.get(path)
        post(client, f"/jobs/{job_id}/cancel", {"reason": "done"})
    text = caplog.text
    for secret in ("sk-live-123", "hunter2", "pgpass99"):
        assert secret not in text


def test_a_database_error_is_a_page_not_a_traceback(console_db: ConsoleDb) -> None:
    app = create_app("postgresql://nobody:pw@127.0.0.1:1/none", timeout=1)
    with TestClient(app, client=LOCAL, base_url=BASE, raise_server_exceptions=False) as client:
        answer = client.get("/")
    assert answer.status_code == 503
    assert "Traceback" not in answer.text and "pw@" not in answer.text
