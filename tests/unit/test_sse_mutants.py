"""The SSE decoder: a field without a space after its colon, text that is not UTF-8 in a field,
and the second call after a failure."""

from __future__ import annotations

import pytest

from domain.errors import HttpError, ProtocolError
from domain.sse import SSE_DONE, SseComment, SseData, SseDecoder, parse_chunk


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
    with pytest.raises(ValueError) as caught:
        decoder.feed(b"data: {}\n\n")
    assert str(caught.value) == "SseDecoder.feed() called after end()"


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


@pytest.mark.parametrize("data", [b'data: {"a":1}\nd', b"data: a\nb\n"])
def test_a_feed_that_only_looks_like_one_whole_event_dispatches_nothing(data: bytes) -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: {}\n\n") == [SseData("{}")]  # whole events so far: the fast path is open
    assert decoder.feed(data) == []


def test_event_data_of_exactly_the_limit_is_taken_in_every_event() -> None:
    decoder = SseDecoder(max_line=10)
    event = b"data:01234\ndata:56789\n\n"  # 10 bytes of data, each line 10 bytes
    assert decoder.feed(event) == [SseData("01234\n56789")]
    assert decoder.feed(event) == [SseData("01234\n56789")]


def test_event_data_over_the_limit_is_refused_saying_so() -> None:
    with pytest.raises(ProtocolError) as caught:
        SseDecoder(max_line=10).feed(b"data:0123\ndata:4567\ndata:89ab\n\n")
    assert str(caught.value) == "SSE event data over 10 bytes"


@pytest.mark.parametrize(("line", "what"), [(b"data: ", "data"), (b":", "comment")])
def test_text_that_is_not_utf8_is_quoted_with_8_bytes_either_side(line: bytes, what: str) -> None:
    raw = b"a" * 20 + b"\xff" + b"b" * 20
    with pytest.raises(ProtocolError) as caught:
        SseDecoder().feed(line + raw + b"\n\n")
    around = b"a" * 8 + b"\xff" + b"b" * 8
    assert str(caught.value) == f"SSE {what} is not valid UTF-8 at byte 20: {around!r}"


def clean_decoder(max_line: int = 1 << 20) -> SseDecoder:
    """A decoder that has taken one whole event: the next whole event may take the fast path."""
    decoder = SseDecoder(max_line=max_line)
    assert decoder.feed(b"data: 1\n\n") == [SseData("1")]
    return decoder


def test_a_line_of_the_limit_is_taken_and_one_byte_more_is_refused_also_on_the_fast_path() -> None:
    assert clean_decoder(max_line=10).feed(b"data: 1234\n\n") == [SseData("1234")]
    with pytest.raises(ProtocolError) as caught:
        clean_decoder(max_line=10).feed(b"data: 12345\n\n")
    assert str(caught.value) == "SSE line of 11 bytes, over 10 bytes"


def test_a_whole_event_ended_by_crlf_loses_its_cr() -> None:
    assert clean_decoder().feed(b"data: {}\r\n\n") == [SseData("{}")]


def test_done_on_the_fast_path_ends_the_stream() -> None:
    decoder = clean_decoder()
    assert decoder.feed(b"data: [DONE]\n\n") == [SSE_DONE]
    assert decoder.done
    assert decoder.feed(b"data: {}\n\n") == []


def test_an_event_whose_data_lines_came_earlier_is_completed_not_replaced() -> None:
    decoder = clean_decoder()
    assert decoder.feed(b"data: x\n") == []
    assert decoder.feed(b"data: y\n\n") == [SseData("x\ny")]


def test_a_line_whose_start_came_earlier_is_completed_not_replaced() -> None:
    decoder = clean_decoder()
    assert decoder.feed(b"data: ab") == []
    assert decoder.feed(b"data: cd\n\n") == [SseData("abdata: cd")]


def test_a_line_limit_of_one_byte_is_taken_and_zero_is_refused() -> None:
    assert SseDecoder(max_line=1).feed(b":\n") == [SseComment("")]
    with pytest.raises(ValueError) as caught:
        SseDecoder(max_line=0)
    assert str(caught.value) == "max_line must be positive, got 0"


def test_a_byte_order_mark_is_skipped_only_at_the_very_start_of_the_stream() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: 1\n\n") == [SseData("1")]
    # Mid-stream the mark is part of the field name, an unknown field: ignored.
    assert decoder.feed(b"\xef\xbb\xbfdata: x\n\n") == []
    assert SseDecoder().feed(b"\xef\xbb\xbfdata: x\n\n") == [SseData("x")]
