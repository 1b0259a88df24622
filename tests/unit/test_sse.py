"""The SSE decoder: every case fed whole, byte by byte and split at random, with one result."""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.errors import HttpError, InferError, ProtocolError
from domain.sse import SSE_DONE, SseComment, SseData, SseDecoder, SseDone, SseEvent, parse_chunk

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Outcome:
    events: tuple[SseEvent, ...]
    error: type[InferError] | None = None
    status: int | None = None  # of an HttpError
    partial: bool = False


def decode(pieces: list[bytes], max_line: int = 1 << 20) -> Outcome:
    decoder = SseDecoder(max_line)
    events: list[SseEvent] = []
    try:
        for piece in pieces:
            events += decoder.feed(piece)
        events += decoder.end()
    except HttpError as exc:
        return Outcome(tuple(events), HttpError, exc.status)
    except ProtocolError:
        return Outcome(tuple(events), ProtocolError)
    return Outcome(tuple(events), partial=decoder.partial_event)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def every_split(data: bytes, max_line: int = 1 << 20) -> Outcome:
    """Decode whole and byte by byte; both must agree. Returns the outcome."""
    whole = decode([data], max_line)
    assert decode([data[i : i + 1] for i in range(len(data))], max_line) == whole
    assert decode([b"", data, b""], max_line) == whole
    return whole


D = SseData
DONE = SseDone()

CASES: dict[str, tuple[bytes, Outcome]] = {
    "one event": (b"data: {}\n\n", Outcome((D("{}"),))),
    "data without a space": (b"data:{}\n\n", Outcome((D("{}"),))),
    "only one leading space is removed": (b"data:  x\n\n", Outcome((D(" x"),))),
    "multi-line data joined with LF": (b"data: a\ndata: b\ndata:\n\n", Outcome((D("a\nb\n"),))),
    "CRLF line ends": (b"data: a\r\n\r\ndata: b\r\n\r\n", Outcome((D("a"), D("b")))),
    "CR line ends": (b"data: a\r\rdata: b\r\r", Outcome((D("a"), D("b")))),
    "mixed line ends": (b"data: a\r\ndata: b\rdata: c\n\r\n", Outcome((D("a\nb\nc"),))),
    "CR then CRLF is two line ends": (b"data: a\r\r\n", Outcome((D("a"),))),
    "comment lines are reported, not dispatched": (
        b":\n\n: ping\ndata: x\n:mid\n\n",
        Outcome((SseComment(""), SseComment(" ping"), SseComment("mid"), D("x"))),
    ),
    "event, id, retry and unknown fields are ignored": (
        b"event: message\nid: 7\nretry: 10\nfoo: bar\nnocolon\ndata: x\n\n",
        Outcome((D("x"),)),
    ),
    "a bare data line is an empty data line": (b"data\n\n", Outcome((D(""),))),
    "an empty data value dispatches empty data": (b"data:\n\n", Outcome((D(""),))),
    "blank lines without data dispatch nothing": (b"\n\n\r\n\n", Outcome(())),
    "a field-only event dispatches nothing": (b"event: x\n\n", Outcome(())),
    "[DONE] alone is the end": (b"data: [DONE]\n\n", Outcome((DONE,))),
    "[DONE] without a space is the end": (b"data:[DONE]\n\n", Outcome((DONE,))),
    # Surprising but per spec: only the exact data "[DONE]" ends the stream.
    "[DONE] with an extra space is data": (b"data:  [DONE]\n\n", Outcome((D(" [DONE]"),))),
    "[DONE] with a trailing space is data": (b"data: [DONE] \n\n", Outcome((D("[DONE] "),))),
    "[DONE] inside JSON is data": (b'data: {"c":"[DONE]"}\n\n', Outcome((D('{"c":"[DONE]"}'),))),
    "[DONE] on one of two data lines is data": (b"data: [DONE]\ndata: x\n\n", Outcome((D("[DONE]\nx"),))),
    "bytes after [DONE] are ignored, even garbage": (
        b"data: a\n\ndata: [DONE]\n\ndata: b\n\n\xff\xfe" + b"x" * 100,
        Outcome((D("a"), DONE)),
    ),
    "[DONE] ends at its blank line even with more in the feed": (
        b"data: [DONE]\n\nerror: {}\n\n",
        Outcome((DONE,)),
    ),
    # One feed of whole one-line events (the role's and the first content's chunk) and its edges.
    "two whole events in one feed": (b"data: a\n\ndata: b\n\n", Outcome((D("a"), D("b")))),
    "whole events then [DONE] then more": (b"data: a\n\ndata: [DONE]\n\ndata: b\n\n", Outcome((D("a"), DONE))),
    "a whole event then one not UTF-8": (b"data: a\n\ndata: \xff\n\n", Outcome((D("a"),), ProtocolError)),
    "a whole event then a comment": (b"data: a\n\n: x\n\n", Outcome((D("a"), SseComment(" x")))),
    "a whole event then one without the space": (b"data: a\n\ndata:b\n\n", Outcome((D("a"), D("b")))),
    "whole events then one blank line more": (b"data: a\n\ndata: b\n\n\n", Outcome((D("a"), D("b")))),
    "a whole event then an empty one": (b"data: a\n\ndata: \n\n", Outcome((D("a"), D("")))),
    "an event without its blank line is not dispatched": (b"data: a\n\ndata: b\n", Outcome((D("a"),), partial=True)),
    "an unterminated last line is not dispatched": (b"data: a\n\ndata: b", Outcome((D("a"),), partial=True)),
    "a clean end has no partial event": (b"data: a\n\n", Outcome((D("a"),), partial=False)),
    "U+2028, U+2029, NEL, VT and FF are not line ends": (
        "data: a\u2028b\u2029c\x85d\x0be\x0cf\n\n".encode(),
        Outcome((D("a\u2028b\u2029c\x85d\x0be\x0cf"),)),
    ),
    "multi-byte UTF-8": ("data: żółw 🐢 漢字\n\n".encode(), Outcome((D("żółw 🐢 漢字"),))),
    "NUL bytes are data (the JSON decoder refuses them)": (b"data: a\x00b\n\n", Outcome((D("a\x00b"),))),
    "a leading byte-order mark is skipped": (b"\xef\xbb\xbfdata: x\n\n", Outcome((D("x"),))),
    "a byte-order mark later is part of a field name": (b"data: a\n\n\xef\xbb\xbfdata: x\n\n", Outcome((D("a"),))),
    "a lone partial byte-order mark is a partial line": (b"\xef\xbb", Outcome((), partial=True)),
    "invalid UTF-8 in data": (b"data: a\n\ndata: \xff\n\ndata: b\n\n", Outcome((D("a"),), ProtocolError)),
    "a truncated UTF-8 sequence at a line end": (b"data: \xe2\x82\n\n", Outcome((), ProtocolError)),
    "invalid UTF-8 in a comment": (b": \xc3\x28\n", Outcome((), ProtocolError)),
    "invalid UTF-8 in an ignored field": (b"id: \xff\n", Outcome((), ProtocolError)),
    "the older error field": (
        b'data: a\n\nerror: {"code":503,"message":"Loading model","type":"unavailable_error"}\n\n',
        Outcome((D("a"),), HttpError, 503),
    ),
    "the older error field nested like a body": (b'error: {"error":{"code":400}}\n\n', Outcome((), HttpError, 400)),
    "the older error field without a code": (b'error: {"message":"boom"}\n\n', Outcome((), HttpError, 500)),
    "the older error field with text": (b"error: out of memory\n\n", Outcome((), HttpError, 500)),
    "the older error field with a bogus code": (b'error: {"code":true}\n\n', Outcome((), HttpError, 500)),
    "error is an error even before its blank line": (b'error: {"code":500}\n', Outcome((), HttpError, 500)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_case_decodes_the_same_whole_and_byte_by_byte(name: str) -> None:
    data, expected = CASES[name]
    assert every_split(data) == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(CASES)), cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_each_case_decodes_the_same_at_random_splits(name: str, cuts: list[int]) -> None:
    data, expected = CASES[name]
    assert decode(split(data, cuts)) == expected


def test_a_crlf_split_across_feeds_is_one_line_end() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\r") == [D("a")]
    assert decoder.feed(b"\ndata: b\n\n") == [D("b")]


def test_utf8_split_inside_a_character_decodes_whole() -> None:
    data = "data: 🐢\n\n".encode()
    for cut in range(len(data) + 1):
        decoder = SseDecoder()
        assert decoder.feed(data[:cut]) + decoder.feed(data[cut:]) == [D("🐢")]


# -- size limits ---------------------------------------------------------------------------------


def test_a_line_of_exactly_max_line_bytes_is_accepted() -> None:
    line = b"data: " + b"x" * 10
    assert every_split(line + b"\n\n", max_line=len(line)) == Outcome((D("x" * 10),))


def test_a_line_one_byte_over_max_line_is_a_protocol_error() -> None:
    line = b"data: " + b"x" * 11
    assert every_split(b"data: a\n\n" + line + b"\n\n", max_line=len(line) - 1) == Outcome((D("a"),), ProtocolError)


def test_an_unterminated_line_over_max_line_fails_before_its_end() -> None:
    decoder = SseDecoder(max_line=16)
    assert decoder.feed(b"data: " + b"x" * 10) == []
    with pytest.raises(ProtocolError, match="over 16 bytes"):
        decoder.feed(b"y")


def test_an_event_whose_data_lines_add_up_over_max_line_is_a_protocol_error() -> None:
    data = b"data: 12345\n" * 4 + b"\n"
    assert every_split(data, max_line=16) == Outcome((), ProtocolError)


def test_the_default_limit_is_one_mib_per_line() -> None:
    ok = b"data: " + b"x" * ((1 << 20) - 6) + b"\n\n"
    assert SseDecoder().feed(ok) == [D("x" * ((1 << 20) - 6))]
    with pytest.raises(ProtocolError, match="1048577 bytes"):
        SseDecoder().feed(b"data: " + b"x" * ((1 << 20) - 5) + b"\n\n")


def test_a_one_mib_line_fed_in_64_kib_reads_fails_as_soon_as_it_is_over() -> None:
    decoder = SseDecoder()
    line = b"data: " + b"x" * (1 << 20)
    with pytest.raises(ProtocolError):
        for start in range(0, len(line), 65536):
            decoder.feed(line[start : start + 65536])
    assert start == len(line) - len(line) % 65536  # failed on the last read, not after a newline


# -- state after the end, after [DONE] and after an error ----------------------------------------


def test_after_done_the_decoder_reports_done_and_ignores_input() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: [DONE]\n\n") == [DONE]
    assert decoder.done
    assert decoder.feed(b"\xff garbage \n\n") == []
    assert decoder.end() == []
    assert not decoder.partial_event


def test_a_failure_is_sticky() -> None:
    decoder = SseDecoder()
    with pytest.raises(ProtocolError):
        decoder.feed(b"data: \xff\n\n")
    with pytest.raises(ProtocolError, match="already failed"):
        decoder.feed(b"data: ok\n\n")
    with pytest.raises(ProtocolError, match="already failed"):
        decoder.end()


def test_events_before_an_error_in_the_same_feed_come_first() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'data: a\n\nerror: {"code":502}\n\n') == [D("a")]
    with pytest.raises(HttpError) as caught:
        decoder.end()
    assert caught.value.status == 502
    assert caught.value.body == '{"code":502}'


def test_feeding_after_end_is_a_bug() -> None:
    decoder = SseDecoder()
    decoder.end()
    with pytest.raises(ValueError, match="after end"):
        decoder.feed(b"data: x\n\n")


def test_max_line_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SseDecoder(max_line=0)


def test_the_fast_path_and_the_general_path_agree_on_invalid_utf8() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\n\n") == [D("a")]  # now on the fast path
    with pytest.raises(ProtocolError, match="UTF-8"):
        decoder.feed(b"data: \xff\n\n")


def test_events_are_cheap_frozen_values() -> None:
    event = D("x")
    with pytest.raises(AttributeError):
        event.data = "y"  # type: ignore[misc]
    assert D("x") == event and SseDone() == DONE and hash(SseComment("p")) == hash(SseComment("p"))


# -- fuzz ----------------------------------------------------------------------------------------

SSE_ALPHABET = st.sampled_from(
    [
        b"data:",
        b"data: ",
        b"error:",
        b":",
        b" ",
        b"\n",
        b"\r",
        b"\r\n",
        b"[DONE]",
        b"x",
        b"{}",
        b"id:",
        b"\xff",
        b"\xe2\x82",
        b"\xac",
        "🐢".encode(),
        b"\x00",
        b"\xef\xbb\xbf",
    ]
)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(st.binary(max_size=120), st.lists(SSE_ALPHABET, max_size=30).map(b"".join)),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
)
def test_arbitrary_bytes_decode_or_raise_protocol_error_the_same_at_every_split(data: bytes, cuts: list[int]) -> None:
    # HttpError is the defined result of the older `error:` field; nothing else may escape.
    whole = decode([data], max_line=64)
    assert decode(split(data, cuts), max_line=64) == whole
    if len(data) <= 48:
        assert decode([data[i : i + 1] for i in range(len(data))], max_line=64) == whole


# -- parse_chunk ---------------------------------------------------------------------------------


def test_parse_chunk_returns_the_object() -> None:
    assert parse_chunk('{"choices":[{"delta":{"content":"hi"}}]}') == {"choices": [{"delta": {"content": "hi"}}]}


@pytest.mark.parametrize(
    "data",
    [
        "",
        "{",
        "[DONE]",
        '{"a":1} x',
        '{"a":"\x00"}',
        "NaN",
        '{"a":"\ud800"}',
        "[" * 2000 + "]" * 2000,
        '{"a": 1e999999}',
    ],
)
def test_parse_chunk_refuses_what_is_not_json(data: str) -> None:
    with pytest.raises(ProtocolError, match="not valid JSON"):
        parse_chunk(data)


@pytest.mark.parametrize("data", ["[]", "1", '"s"', "null", "true"])
def test_parse_chunk_refuses_json_that_is_not_an_object(data: str) -> None:
    with pytest.raises(ProtocolError, match="not an object"):
        parse_chunk(data)


@pytest.mark.parametrize(
    ("data", "status"),
    [
        ('{"error":{"code":500,"message":"boom","type":"server_error"}}', 500),
        ('{"error":{"code":400,"message":"bad"}}', 400),
        ('{"error":{"message":"no code"}}', 500),
        ('{"error":"text"}', 500),
        ('{"error":{"code":"500"}}', 500),
        ('{"error":{"code":99}}', 500),
        ('{"error":{"code":false}}', 500),
        ('{"error":null}', 500),
    ],
)
def test_parse_chunk_raises_the_in_stream_error_form(data: str, status: int) -> None:
    with pytest.raises(HttpError) as caught:
        parse_chunk(data)
    assert caught.value.status == status
    assert caught.value.body == data


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_parse_chunk_on_any_text_returns_a_dict_or_raises_a_defined_error(data: str) -> None:
    with contextlib.suppress(ProtocolError, HttpError):
        assert type(parse_chunk(data)) is dict


# -- the words of each refusal, fields without a space, whole events on the fast path, the limits' edges ---


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


def general_path(*_: object) -> None:
    raise AssertionError("the general path ran")


def test_the_first_whole_event_of_a_stream_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first content of a turn is often the first event: it must not pay for the general path.
    monkeypatch.setattr(SseDecoder, "_lines", general_path)
    decoder = SseDecoder()
    assert decoder.feed(b'data: {"a":1}\n\n') == [SseData('{"a":1}')]
    assert decoder.feed(b"data: [DONE]\n\n") == [SSE_DONE]


def test_two_whole_events_in_one_feed_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # llama-server's first chunk holds the role's event and the first content's: the first token.
    monkeypatch.setattr(SseDecoder, "_lines", general_path)
    decoder = SseDecoder()
    assert decoder.feed(b"data: {}\n\ndata: [1]\n\n") == [SseData("{}"), SseData("[1]")]
    assert decoder.feed(b"data: 2\n\ndata: [DONE]\n\ndata: 3\n\n") == [SseData("2"), SSE_DONE]


def test_a_second_whole_event_over_the_line_limit_is_refused_after_the_first() -> None:
    line = b"data: " + b"x" * 11
    assert every_split(b"data: a\n\n" + line + b"\n\n", max_line=len(line) - 1) == Outcome((D("a"),), ProtocolError)


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
