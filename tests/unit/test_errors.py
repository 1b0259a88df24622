"""stream_error takes a code as its status only from 100 to 599; HttpError keeps any body as text."""

from __future__ import annotations

import pytest

from domain.errors import HttpError, stream_error


@pytest.mark.parametrize(("code", "status"), [(99, 500), (100, 100), (101, 101), (598, 598), (599, 599), (600, 500)])
def test_a_code_is_the_status_only_from_100_to_599(code: int, status: int) -> None:
    assert stream_error({"error": {"code": code}}, "body").status == status
    assert stream_error({"code": code}, "body").status == status


def test_an_error_body_text_with_a_lone_surrogate_is_kept_with_a_replacement() -> None:
    assert HttpError(500, "bad \ud800 body").body == "bad ? body"


def test_an_error_body_that_is_not_utf8_is_kept_with_replacement_characters() -> None:
    assert HttpError(502, b"bad \xff body").body == "bad \ufffd body"


@pytest.mark.parametrize(
    ("body", "limit", "kept"),
    [("ééé", 3, "é"), ("ééé", 4, "éé"), ("a😀b", 4, "a"), ("a😀b", 5, "a😀"), ("😀", 2, ""), ("€x", 1, "")],
)
def test_an_error_body_is_cut_before_a_character_the_limit_would_split(body: str, limit: int, kept: str) -> None:
    error = HttpError(500, body, limit=limit)

    assert error.body == kept
    assert len(error.body.encode("utf-8")) <= limit


def test_the_message_quotes_the_first_200_characters_of_the_body() -> None:
    error = HttpError(503, "x" * 300)
    assert str(error) == "HTTP 503: " + "x" * 200
    assert error.body == "x" * 300


def test_an_error_body_of_exactly_its_limit_is_kept_whole() -> None:
    assert HttpError(500, b"x" * 8, limit=8).body == "x" * 8


def test_the_cut_backs_off_at_most_three_continuation_bytes_a_character_has() -> None:
    # Bytes that are not UTF-8: no character to keep whole past three.
    assert HttpError(500, b"a" + b"\x80" * 8, limit=5).body == "a\ufffd"
