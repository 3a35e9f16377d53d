"""leaseq refuses a server it cannot run on before it changes anything, saying why.

Its views are ``security_invoker``, which PostgreSQL 15 added: on an older server the
migrations would stop at the first statement it does not know, with the ones before it
applied (each migration is its own transaction). No server older than 15 runs here, so the
rule is tested as the function that ``leaseq migrate`` and a starting worker apply to what
the server reports; tests/integration/test_encoding.py reads that report from a real server
and runs the encoding refusal end to end.
"""

from __future__ import annotations

import pytest

from leaseq.core.errors import ServerTooOld, WrongEncoding
from leaseq.core.schema import server_refusal


@pytest.mark.parametrize(("version_num", "version"), [(140013, "14.13"), (130000, "13.0")])
def test_a_server_before_15_is_refused_by_its_version(version_num: int, version: str) -> None:
    refusal = server_refusal(version_num, version, "SQL_ASCII")
    assert isinstance(refusal, ServerTooOld)
    assert f"this server runs PostgreSQL {version}" in str(refusal)
    assert "needs PostgreSQL 15 or later" in str(refusal)
    assert "Nothing was changed." in str(refusal)


@pytest.mark.parametrize(
    ("version_num", "version"), [(150000, "15.0"), (150020, "15.20"), (180006, "18.6")]
)
def test_15_and_later_in_utf8_are_accepted(version_num: int, version: str) -> None:
    assert server_refusal(version_num, version, "UTF8") is None


def test_a_database_not_in_utf8_is_refused_by_its_encoding() -> None:
    refusal = server_refusal(180006, "18.6", "SQL_ASCII")
    assert isinstance(refusal, WrongEncoding)
    assert "encoding is SQL_ASCII; leaseq needs UTF8" in str(refusal)
