"""The SSE decoder: a field without a space after its colon, text that is not UTF-8 in a field,
and the second call after a failure."""

from __future__ import annotations

import pytest

from domain.errors import HttpError, ProtocolError
from domain.sse import SSE_DONE, SseData, SseDecoder, parse_chunk


def test_an_error_field_without_a_space_after_the_colon_keeps_its_whole_json() -> None:
    decoder = SseDecoder()
    with pytest.raises(HttpError) as caught:
        decoder.feed(b'error:{"code":503,"message":"Loading model"}\n\n')
    assert caught.value.status == 503
    assert caught.value.body == '{"code":503,"message":"Loading model"}'


def test_an_unknown_field_without_a_space_after_the_colon_is_ignored() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"event:x\nid:1\ndata: {}\n\n") == [SseData("{}")]


def test_a_field_value_that_is_not_utf8_is_refused_as_a_field_value() -> None:
    with pytest.raises(ProtocolError) as caught:
        SseDecoder().feed(b"event: \xff\n\n")
    assert str(caught.value) == "SSE field value is not valid UTF-8 at byte 0: b'\\xff'"


def test_a_field_name_that_is_not_utf8_is_refused_as_a_field_name() -> None:
    with pytest.raises(ProtocolError) as caught:
        SseDecoder().feed(b"ev\xffnt: x\n\n")
    assert str(caught.value) == "SSE field name is not valid UTF-8 at byte 2: b'ev\\xffnt'"


def test_after_a_failure_the_next_call_says_the_stream_already_failed() -> None:
    decoder = SseDecoder()
    with pytest.raises(ProtocolError) as first:
        decoder.feed(b"event: \xff\n\n")
    with pytest.raises(ProtocolError) as second:
        decoder.feed(b"data: {}\n\n")
    assert str(second.value) == f"SSE stream already failed: {first.value}"
    assert second.value.__cause__ is first.value
    with pytest.raises(ProtocolError, match=r"^SSE stream already failed: "):
        decoder.end()


def test_a_second_end_keeps_the_partial_event_the_first_one_saw() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'data: {"cut":') == []
    assert decoder.end() == []
    assert decoder.partial_event
    assert decoder.end() == []
    assert decoder.partial_event


def test_a_feed_after_end_is_refused_also_after_done() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: [DONE]\n\n") == [SSE_DONE]
    assert decoder.end() == []
    assert not decoder.partial_event
    with pytest.raises(ValueError, match=r"called after end\(\)"):
        decoder.feed(b"data: {}\n\n")


def test_a_failure_after_events_is_raised_once_then_called_already_failed() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: {}\n\nevent: \xff\n\n") == [SseData("{}")]  # the error waits for the next call
    with pytest.raises(ProtocolError) as first:
        decoder.feed(b"data: {}\n\n")
    assert str(first.value).startswith("SSE field value is not valid UTF-8")
    with pytest.raises(ProtocolError) as second:
        decoder.feed(b"data: {}\n\n")
    assert str(second.value) == f"SSE stream already failed: {first.value}"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{" + "x" * 199, "SSE data is not valid JSON"),
        ("[" + "1," * 99 + "1]", "SSE data is JSON but not an object"),
    ],
)
def test_data_that_is_not_a_json_object_is_quoted_up_to_120_characters(data: str, message: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_chunk(data)
    assert str(caught.value).startswith(message)
    assert str(caught.value).endswith(f": {data[:120]!r}")
