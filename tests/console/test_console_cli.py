"""`leaseq migrate --console-role` grants the console's role; `leaseq console` refuses to serve
without authentication on a public address."""

from __future__ import annotations

import psycopg
import pytest

from leaseq.cli.main import main
from support.consoledb import ConsoleDb
from support.roles import login_roles


def _can(url: str, function: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT has_function_privilege(%s, 'EXECUTE')", (function,)).fetchone()
    assert row is not None
    return bool(row[0])


RETRY = "leaseq.console_retry_dead(bigint[], text, text, jsonb)"


def test_migrate_grants_the_console_role(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with login_roles(database_url, "console") as roles:
        role, url = roles.names["console"], roles.urls["console"]
        assert main(["migrate", "--database-url", database_url, "--console-role", role]) == 0
        assert "GRANT EXECUTE ON FUNCTION leaseq.console_retry_dead" in capsys.readouterr().out
        assert _can(url, RETRY)
        args = ["migrate", "--database-url", database_url, "--console-role", role]
        assert main([*args, "--console-admin", "false"]) == 0
        assert not _can(url, RETRY)
        with psycopg.connect(url) as conn:  # still reads
            conn.execute("SELECT count(*) FROM leaseq.jobs").fetchone()


def test_a_second_console_role_is_refused_unless_it_replaces_the_first(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with login_roles(database_url, "console", "other") as roles:
        first, second = roles.names["console"], roles.names["other"]
        base = ["migrate", "--database-url", database_url, "--console-role"]
        assert main([*base, first]) == 0
        capsys.readouterr()
        assert main([*base, second]) == 2
        err = capsys.readouterr().err
        assert f"{first} is leaseq's console role" in err and "--console-replace true" in err
        assert _can(roles.urls["console"], RETRY)  # the first keeps its grants
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # not even the schema
            _can(roles.urls["other"], RETRY)
        assert main([*base, first, "--console-admin", "false"]) == 0  # the same role: fine
        assert main([*base, second, "--console-replace", "true"]) == 0
        assert _can(roles.urls["other"], RETRY)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the first lost its grants
            _can(roles.urls["console"], RETRY)


def test_the_console_role_must_not_be_a_component_role(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with login_roles(database_url) as roles:
        worker = roles.names["worker"]
        base = ["migrate", "--database-url", database_url, "--worker-role", worker]
        assert main([*base, "--console-role", worker]) == 2
        assert "component" in capsys.readouterr().err


def test_console_without_auth_refuses_a_public_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["console", "--database-url", "postgresql://c@db/app", "--address", "0.0.0.0"]
    assert main(args) == 2
    assert "not loopback" in capsys.readouterr().err


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``leaseq console`` up to serving: uvicorn.run records the app's start instead of
    listening, so the command returns."""
    import uvicorn

    started: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: started.append(kwargs["host"]))
    return started


def test_console_refuses_a_role_no_policy_holds(
    console_db: ConsoleDb, served: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    owner = console_db.owner_url
    with login_roles(owner, "bypass", "member") as roles:
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(f'ALTER ROLE "{roles.names["bypass"]}" BYPASSRLS')
            row = conn.execute("SELECT current_user").fetchone()
            assert row is not None
            conn.execute(f'GRANT "{row[0]}" TO "{roles.names["member"]}"')
        for url, why in (
            (owner, "is a superuser"),
            (roles.urls["bypass"], "has BYPASSRLS"),
            (roles.urls["member"], "owns leaseq's tables"),
        ):
            assert main(["console", "--database-url", url]) == 2, why
            err = capsys.readouterr().err
            assert why in err and "--console-role" in err and "--allow-privileged-role" in err
    assert served == []
    assert main(["console", "--database-url", console_db.admin_url]) == 0
    assert served == ["127.0.0.1"]


def test_console_serves_a_privileged_role_when_told_with_a_warning(
    console_db: ConsoleDb, served: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["console", "--database-url", console_db.owner_url]
    assert main([*args, "--allow-privileged-role", "true"]) == 0
    assert served == ["127.0.0.1"]
    err = capsys.readouterr().err
    assert "WARNING" in err and "IS A SUPERUSER" in err
