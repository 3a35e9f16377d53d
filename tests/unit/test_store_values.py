"""How the store reads JSON in worker sessions: as json.loads would, only faster."""

from __future__ import annotations

import json

import pytest

from leaseq.core._store.store import _utf8_json


@pytest.mark.parametrize("text", [b"null", b"[1, 2]", b' {"a": 1}', b'"x" ', "{}"])
def test_reads_what_json_loads_reads(text: bytes | str) -> None:
    assert _utf8_json(text) == json.loads(text)


@pytest.mark.parametrize("text", [b"[1] 2", b"{", b"", b"nul"])
def test_refuses_what_json_loads_refuses(text: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        _utf8_json(text)
