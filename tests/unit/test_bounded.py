"""What leaseq stores or logs is bounded and storable, and says what was changed."""

from __future__ import annotations

from leaseq.core import bounded


def test_plain_text_is_unchanged() -> None:
    assert bounded.text("ValueError: bad page\n\tat line 3") == bounded.Bounded(
        "ValueError: bad page\n\tat line 3"
    )


def test_nuls_controls_and_surrogates_are_replaced_and_counted() -> None:
    b = bounded.text("a\x00b\x1b[31mc\ud800d")
    assert b.value.startswith("a\ufffdb\\x1b[31mc\ufffdd [")
    assert b.note == (
        "1 NUL replaced by U+FFFD; 1 unpaired surrogates replaced by U+FFFD; "
        "1 control characters escaped"
    )
    b.value.encode()  # storable


def test_long_text_is_cut_and_says_how_much() -> None:
    b = bounded.text("x" * 100, limit=10)
    assert b.value == "xxxxxxxxxx [cut: 100 characters in all, the first 10 kept]"


def test_json_strings_and_keys_lose_their_nuls() -> None:
    b = bounded.json({"t\x00": ["a\x00", {"b": "c\x00\x00"}], "n": 1}, "result")
    assert b.value == {"t\ufffd": ["a\ufffd", {"b": "c\ufffd\ufffd"}], "n": 1}
    assert b.note == "result: 4 NUL replaced by U+FFFD"


def test_clean_json_is_returned_as_is() -> None:
    value = {"a": [1, "b"]}
    assert bounded.json(value, "result").value is value
