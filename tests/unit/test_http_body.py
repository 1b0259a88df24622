"""Body de-framing, sans-IO: chunked, content-length, read-to-close and none.

Every case is fed whole, byte by byte and split at random with one result; the chunked reader is
checked against h11 as an oracle (it may be stricter than h11, never more lenient).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.uds_http.body import GATHER_BYTES, SMALL_CHUNK, BodyReader, ChunkedBody, EmptyBody, LengthBody
from domain.errors import InferError, ProtocolError, StreamClosedEarly

pytestmark = pytest.mark.timeout(60)

LIMIT = 64  # chunk-size line and trailer limit in these tests


@dataclass(frozen=True)
class Result:
    body: bytes
    ended: bool  # the framing said the body ended (before or at EOF)
    error: type[InferError] | None = None
    message: str = ""


def run(make: Callable[[], BodyReader], pieces: list[bytes], eof: bool = True) -> Result:
    reader = make()
    out = bytearray()
    try:
        for piece in pieces:
            reader.push(piece)
            while (got := reader.pull()) is not None:
                if not got:
                    return Result(bytes(out), True)
                out += got
        if eof:
            reader.eof()
            while (got := reader.pull()) is not None:
                if not got:
                    return Result(bytes(out), True)
                out += got
            raise AssertionError("pull() returned None after EOF")
    except (ProtocolError, StreamClosedEarly) as exc:
        return Result(bytes(out), False, type(exc), str(exc))
    return Result(bytes(out), False)


def same(result: Result) -> tuple[bytes, bool, type[InferError] | None]:
    return result.body, result.ended, result.error


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def every_split(make: Callable[[], BodyReader], data: bytes) -> Result:
    whole = run(make, [data])
    assert same(run(make, [data[i : i + 1] for i in range(len(data))])) == same(whole)
    assert same(run(make, [b"", data])) == same(whole)
    return whole


def chunked() -> BodyReader:
    return ChunkedBody("GET /", LIMIT)


CHUNKED: dict[str, tuple[bytes, bytes, bool, type[InferError] | None]] = {
    # name: (input, body, ended, error)
    "two chunks": (b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", b"hello world", True, None),
    "hex in either case with leading zeros": (
        b"000A\r\n0123456789\r\na\r\nabcdefghij\r\n0\r\n\r\n",
        b"0123456789abcdefghij",
        True,
        None,
    ),
    "chunk extensions are accepted": (
        b'5;name=value\r\nhello\r\n1;a;b="q;x"\r\n!\r\n0;end\r\n\r\n',
        b"hello!",
        True,
        None,
    ),
    "whitespace before an extension is accepted": (b"5 \t;x=1\r\nhello\r\n0\r\n\r\n", b"hello", True, None),
    "trailers are accepted and ignored": (b"2\r\nhi\r\n0\r\nX-Trace: 1\r\nChecksum: abc\r\n\r\n", b"hi", True, None),
    "bytes after the end are ignored": (b"2\r\nhi\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n", b"hi", True, None),
    "a chunk holding CRLF and NUL": (b"4\r\n\r\n\x00\xff\r\n0\r\n\r\n", b"\r\n\x00\xff", True, None),
    "garbage chunk size": (b"zz\r\nhello\r\n", b"", False, ProtocolError),
    "empty chunk size line": (b"\r\nhello\r\n", b"", False, ProtocolError),
    "signed chunk size": (b"+5\r\nhello\r\n", b"", False, ProtocolError),
    "0x chunk size": (b"0x5\r\nhello\r\n", b"", False, ProtocolError),
    "underscore in chunk size": (b"1_0\r\n", b"", False, ProtocolError),
    "leading space in chunk size": (b" 5\r\nhello\r\n", b"", False, ProtocolError),
    "NUL in chunk size": (b"5\x00\r\nhello\r\n", b"", False, ProtocolError),
    "NUL in an extension": (b"5;a\x00\r\nhello\r\n", b"", False, ProtocolError),
    "bare LF after the size": (b"5\nhello\r\n0\r\n\r\n", b"", False, ProtocolError),
    "17 hex digits overflow": (b"1" + b"0" * 16 + b"\r\n", b"", False, ProtocolError),
    "16 hex digits then EOF": (b"ffffffffffffffff\r\nabc", b"abc", False, StreamClosedEarly),
    "chunk data not followed by CRLF": (b"5\r\nhelloXX0\r\n\r\n", b"hello", False, ProtocolError),
    "chunk data followed by CR and garbage": (b"5\r\nhello\rX", b"hello", False, ProtocolError),
    "chunk size line over the limit": (b"5;" + b"x" * LIMIT + b"\r\nhello\r\n", b"", False, ProtocolError),
    "unterminated chunk size line over the limit": (b"5;" + b"x" * (LIMIT + 8), b"", False, ProtocolError),
    "malformed trailer": (b"0\r\nnot a header\r\n\r\n", b"", False, ProtocolError),
    "trailers over the limit": (b"0\r\n" + b"X-A: 0123456789\r\n" * 5 + b"\r\n", b"", False, ProtocolError),
    "EOF before the first chunk": (b"", b"", False, StreamClosedEarly),
    "EOF inside a chunk size line": (b"5\r\nhello\r\n1", b"hello", False, StreamClosedEarly),
    "EOF inside a chunk": (b"5\r\nhel", b"hel", False, StreamClosedEarly),
    "EOF before a chunk's CRLF": (b"5\r\nhello\r", b"hello", False, StreamClosedEarly),
    "EOF between chunks": (b"5\r\nhello\r\n", b"hello", False, StreamClosedEarly),
    "EOF inside the trailers": (b"5\r\nhello\r\n0\r\nX-A: 1\r\n", b"hello", False, StreamClosedEarly),
}


@pytest.mark.parametrize("name", list(CHUNKED))
def test_chunked_cases_are_the_same_whole_and_byte_by_byte(name: str) -> None:
    data, body, ended, error = CHUNKED[name]
    assert same(every_split(chunked, data)) == (body, ended, error)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(CHUNKED)), cuts=st.lists(st.integers(min_value=0), max_size=10))
def test_chunked_cases_are_the_same_at_random_splits(name: str, cuts: list[int]) -> None:
    data, body, ended, error = CHUNKED[name]
    assert same(run(chunked, split(data, cuts))) == (body, ended, error)


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"", "before the first chunk"),
        (b"5\r\nhel", "inside chunk 1 after 3 of its 5 bytes"),
        (b"5\r\nhello\r\n3\r\nab", "inside chunk 2 after 2 of its 3 bytes (7 body bytes)"),
        (b"5\r\nhello\r\n", "after chunk 1 (5 body bytes), before the terminating zero-size chunk"),
        (b"5\r\nhello\r\n0\r\n", "inside the trailers after 1 chunks"),
    ],
)
def test_eof_inside_a_chunked_body_says_where(data: bytes, where: str) -> None:
    result = run(chunked, [data])
    assert result.error is StreamClosedEarly
    assert where in result.message
    assert result.message.startswith("GET /: connection closed")


def test_a_bad_chunk_names_the_chunk() -> None:
    result = run(chunked, [b"1\r\na\r\n2\r\nbc\r\nq\r\n"])
    assert result.error is ProtocolError
    assert "malformed chunk size line b'q' after 2 chunks" in result.message


def test_a_long_chunk_is_handed_out_as_it_arrives() -> None:
    reader = ChunkedBody("x", LIMIT)
    reader.push(b"a\r\n0123")
    assert reader.pull() == b"0123"
    assert reader.pull() is None
    reader.push(b"456789\r\n0\r\n\r\n")
    assert reader.pull() == b"456789"
    assert reader.pull() == b""
    assert reader.received == 10


def framed(*chunks: bytes) -> bytes:
    return b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks)


def test_a_whole_buffered_chunk_of_an_events_size_is_one_piece() -> None:
    event, other = b"e" * SMALL_CHUNK, b"f" * (SMALL_CHUNK + 1)
    reader = ChunkedBody("x", LIMIT, framed(event, other))
    assert [reader.pull(), reader.pull(), reader.pull()] == [event, other, None]


def test_tiny_chunks_buffered_together_are_one_piece_up_to_the_gather_limit() -> None:
    data = b"".join(bytes([65 + i % 26]) for i in range(GATHER_BYTES + 10))
    reader = ChunkedBody("x", LIMIT, framed(*(data[i : i + 1] for i in range(len(data)))) + b"0\r\n\r\n")
    first = reader.pull()
    assert first == data[:GATHER_BYTES]
    assert reader.pull() == data[GATHER_BYTES:]
    assert reader.pull() == b""
    assert reader.received == len(data)


def test_tiny_chunks_stop_gathering_at_an_events_size_chunk_and_at_a_partial_one() -> None:
    event = b"e" * SMALL_CHUNK
    reader = ChunkedBody("x", LIMIT, framed(b"a", b"b", event, b"c") + b"5\r\nde")
    assert [reader.pull(), reader.pull(), reader.pull()] == [b"ab" + event, b"cde", None]


@pytest.mark.parametrize(
    ("tail", "first", "error"),
    [
        (b"zz\r\n", b"ab", ProtocolError),
        (b"3\r\nabcXX", b"ababc", ProtocolError),
        (b"3\r\nab", b"abab", StreamClosedEarly),
    ],
    ids=["bad size line", "no CRLF after a chunk", "cut inside a chunk"],
)
def test_tiny_chunks_before_a_fault_are_handed_out_first_and_the_fault_then(
    tail: bytes, first: bytes, error: type
) -> None:
    reader = ChunkedBody("x", LIMIT, framed(b"a", b"b") + tail)
    reader.eof()
    assert reader.pull() == first
    with pytest.raises(error):
        reader.pull()
    with pytest.raises(error):
        reader.pull()


# -- content-length, read-to-close, no body ------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "data", "expected"),
    [
        (5, b"hello", (b"hello", True, None)),
        (5, b"hello world", (b"hello", True, None)),
        (0, b"", (b"", True, None)),
        (0, b"ignored", (b"", True, None)),
        (5, b"hel", (b"hel", False, StreamClosedEarly)),
        (5, b"", (b"", False, StreamClosedEarly)),
    ],
)
def test_content_length_bodies(length: int, data: bytes, expected: tuple[bytes, bool, type | None]) -> None:
    assert same(every_split(lambda: LengthBody("x", length), data)) == expected


def test_a_short_content_length_body_says_how_short() -> None:
    result = run(lambda: LengthBody("POST /v1/chat/completions", 10), [b"abc"])
    assert result.message == (
        "POST /v1/chat/completions: connection closed inside the body: content-length short, 3 of 10 bytes received"
    )


@pytest.mark.parametrize("data", [b"", b"hello", b"\r\n0\r\n\r\n"])
def test_a_read_to_close_body_is_everything_until_eof(data: bytes) -> None:
    assert same(every_split(lambda: BodyReader("x"), data)) == (data, True, None)


def test_a_read_to_close_body_waits_until_eof() -> None:
    reader = BodyReader("x", b"abc")
    assert reader.pull() == b"abc"
    assert reader.pull() is None
    reader.eof()
    assert reader.pull() == b""


def test_an_empty_body_ends_at_once_and_ignores_bytes() -> None:
    assert same(every_split(lambda: EmptyBody("x"), b"garbage")) == (b"", True, None)


# -- against h11 as an oracle ------------------------------------------------------------------


def h11_chunked(data: bytes) -> bytes | None:
    """h11's reading of a chunked body, EOF after `data`; None if it refuses or hits EOF."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + data)
    conn.receive_data(b"")
    out = bytearray()
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Data):
                out += event.data
            elif isinstance(event, h11.EndOfMessage):
                return bytes(out)
    except h11.RemoteProtocolError:
        return None


chunk_payloads = st.lists(st.binary(min_size=1, max_size=40), max_size=8)
extensions = st.sampled_from([b"", b";a", b";a=b", b';q="x;y"', b";" + b"e" * 20])
trailers = st.lists(st.sampled_from([b"X-A: 1", b"Trace: abc def", b"Empty:"]), max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=chunk_payloads,
    exts=st.lists(extensions, min_size=9, max_size=9),
    upper=st.booleans(),
    trailer=trailers,
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_valid_chunked_bodies_decode_like_h11_at_any_split(
    payloads: list[bytes], exts: list[bytes], upper: bool, trailer: list[bytes], cuts: list[int]
) -> None:
    encoded = b""
    for payload, ext in zip(payloads, exts, strict=False):
        size = b"%X" % len(payload) if upper else b"%x" % len(payload)
        encoded += size + ext + b"\r\n" + payload + b"\r\n"
    encoded += b"0" + exts[-1] + b"\r\n" + b"".join(t + b"\r\n" for t in trailer) + b"\r\n"
    expected = b"".join(payloads)
    assert h11_chunked(encoded) == expected
    assert same(run(chunked, split(encoded, cuts))) == (expected, True, None)


CHUNK_ALPHABET = st.sampled_from(
    # whole chunks, ends and trailers, so that valid bodies are common, and pieces that break them
    [
        b"1\r\nx\r\n",
        b"3\r\nabc\r\n",
        b"2;e\r\n\r\n\r\n",
        b"0\r\n\r\n",
        b"0\r\n",
        b"X-A: 1\r\n",
        b"\r\n",
        b"0",
        b"1",
        b"5",
        b"a",
        b"F",
        b"\r",
        b"\n",
        b";",
        b"=",
        b"x",
        b"X-A:",
        b"\x00",
        b"\xff",
        b"hello",
    ]
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(st.binary(max_size=80), st.lists(CHUNK_ALPHABET, max_size=30).map(b"".join)),
    cuts=st.lists(st.integers(min_value=0), max_size=5),
)
def test_arbitrary_bytes_decode_or_fail_cleanly_and_never_more_leniently_than_h11(data: bytes, cuts: list[int]) -> None:
    whole = run(chunked, [data])
    assert same(run(chunked, split(data, cuts))) == same(whole)
    if whole.ended and b" " not in data and b"\t" not in data:  # whitespace before ";" is ours alone
        assert h11_chunked(data) == whole.body
