"""A response head read without h11 is the head h11 reads: the same status, headers and body
bytes, or the same kind of error, for any bytes and any split of them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest_mock import MockerFixture

from adapters.uds_http.response import ResponseParser, render
from domain.errors import ProtocolError, StreamClosedEarly

HEADER_BYTES = 512
LLAMA_HEAD = (
    b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\nX-Accel-Buffering: no\r\n"
    b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)

Outcome = tuple[str, object]


def read(raw: bytes, cuts: list[int], *, plain: bool) -> Outcome:
    """What the parser makes of `raw` cut at `cuts`, then EOF, driven as an exchange does; with
    `plain=False`, h11 reads the head."""
    parser = ResponseParser(render("GET", "/x", None, HEADER_BYTES), plain=plain)
    edges = sorted({0, *(c for c in cuts if 0 < c < len(raw)), len(raw)})
    pieces = [raw[a:b] for a, b in itertools.pairwise(edges)] + [b""]
    try:
        head = parser.next_head()
        for piece in pieces:
            if head is not None:
                break
            parser.receive_data(piece)
            head = parser.next_head()
    except StreamClosedEarly:
        return ("closed", None)
    except ProtocolError:
        return ("refused", None)
    assert head is not None
    return ("head", (head.status, head.headers))


def same(raw: bytes, cuts: tuple[int, ...] | list[int] = ()) -> None:
    assert read(raw, list(cuts), plain=True) == read(raw, list(cuts), plain=False), raw


@pytest.mark.parametrize(
    "raw",
    [
        LLAMA_HEAD + b"5\r\nhello\r\n",
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.0 200 OK\r\n\r\nbody",
        b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A:   spaced value \t\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\n{}",  # h11 folds it: h11 reads it
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n",  # obs-fold
        b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",  # bare LF: h11 takes it
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/2.0 200 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: \x00\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n",
        b" HTTP/1.1 200 OK\r\n\r\n",
        b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n",  # EOF inside the head
        b"",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * HEADER_BYTES + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (HEADER_BYTES - 40) + b"\r\n\r\n",
    ],
)
def test_each_head_is_read_as_h11_reads_it_whole_and_byte_by_byte(raw: bytes) -> None:
    same(raw)
    same(raw, list(range(len(raw))))


fragments = st.sampled_from(
    [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.0 404 Not Found",
        b"HTTP/1.1 101",
        b"Content-Length: 3",
        b"Content-Length: x",
        b"Transfer-Encoding: chunked",
        b"transfer-encoding: Chunked",
        b"X-A: b",
        b"X-A:",
        b" folded",
        b"\t",
        b"\r\n",
        b"\n",
        b"\r",
        b":",
        b" ",
        b"\x00",
        b"\xff",
        b"abc",
    ]
)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(fragments, max_size=12), cuts=st.lists(st.integers(0, 200), max_size=6))
def test_any_bytes_in_any_split_are_read_as_h11_reads_them(parts: list[bytes], cuts: list[int]) -> None:
    same(b"".join(parts), cuts)
    same(b"".join(parts) + b"\r\n\r\nrest", cuts)


@pytest.mark.parametrize(
    "payload",
    [
        b"data: {}\n\ndata: {}\n\n",  # SSE events: bare blank lines after the head's CRLF one
        b"\n\n\n\n",
        b"\r\n\r\n",
    ],
)
def test_a_llama_server_head_is_read_without_h11_whatever_blank_lines_follow(
    payload: bytes, mocker: MockerFixture
) -> None:
    to_h11 = mocker.spy(ResponseParser, "_to_h11")
    parser = ResponseParser(render("GET", "/x", None, HEADER_BYTES))
    parser.receive_data(LLAMA_HEAD + b"%x\r\n%s\r\n" % (len(payload), payload))

    head = parser.next_head()

    assert head is not None and head.status == 200
    assert to_h11.call_count == 0, "the head's end was not found where it is"
    assert parser.body is not None and parser.body.pull() == payload
