"""What response heads are read and what refused (h11's grammar, under the size cap), and that
any split of the same bytes gives the same result."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.uds_http.response import ResponseParser, render
from domain.errors import ProtocolError, StreamClosedEarly

HEADER_BYTES = 512
LLAMA_HEAD = (
    b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
    b"X-Accel-Buffering: no\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)

Outcome = tuple[str, object]


def read(raw: bytes, cuts: list[int]) -> Outcome:
    """What the parser makes of `raw` cut at `cuts`, then EOF, driven as an exchange does: the
    head's status, or how it failed."""
    parser = ResponseParser(render("GET", "/x", None, HEADER_BYTES))
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


def status(raw: bytes) -> object:
    """The status read from `raw` whole and in every split tried, which all agree; or how
    reading it failed."""
    whole = read(raw, [])
    assert read(raw, list(range(len(raw)))) == whole, "byte by byte"
    for cut in range(1, len(raw)):
        assert read(raw, [cut]) == whole, cut
    kind, found = whole
    return found[0] if kind == "head" else kind  # type: ignore[index]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (LLAMA_HEAD + b"5\r\nhello\r\n", 200),
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}", 503),
        (b"HTTP/1.0 200 OK\r\n\r\nbody", 200),
        (b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 200),
        (b"HTTP/1.1 200 OK\r\nX-A:   spaced value \t\r\nContent-Length: 0\r\n\r\n", 200),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n", 200),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\n{}", 200),  # h11 folds the two alike
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "refused"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "refused"),
        (b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n", 200),  # obs-fold
        (b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", 200),  # bare LF: h11 takes it
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200),
        (b"HTTP/2.0 200 OK\r\n\r\n", "refused"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "refused"),
        (b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n", "refused"),
        (b"HTTP/1.1 200 OK\r\nX-A: \x00\r\n\r\n", "refused"),
        (b"HTTP/1.1 200 OK\r\nX-A: caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n", 200),
        (b" HTTP/1.1 200 OK\r\n\r\n", "refused"),
        (b"\r\n\r\n", "refused"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", "closed"),  # EOF inside the head
        (b"", "closed"),
        (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * HEADER_BYTES + b"\r\n\r\n", "refused"),
        (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (HEADER_BYTES - 40) + b"\r\n\r\n", 200),
    ],
)
def test_each_head_is_read_or_refused_alike_whole_and_in_every_split(
    raw: bytes,
    expected: object,
) -> None:
    assert status(raw) == expected


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
def test_any_bytes_in_any_split_are_read_as_they_are_whole(
    parts: list[bytes],
    cuts: list[int],
) -> None:
    for raw in (b"".join(parts), b"".join(parts) + b"\r\n\r\nrest"):
        assert read(raw, cuts) == read(raw, []), raw


@pytest.mark.parametrize(
    "payload",
    [
        b"data: {}\n\ndata: {}\n\n",  # SSE events: bare blank lines after the head's CRLF one
        b"\n\n\n\n",
        b"\r\n\r\n",
    ],
)
def test_a_llama_server_head_ends_at_its_blank_line_whatever_blank_lines_follow(
    payload: bytes,
) -> None:
    parser = ResponseParser(render("GET", "/x", None, HEADER_BYTES))
    parser.receive_data(LLAMA_HEAD + b"%x\r\n%s\r\n" % (len(payload), payload))

    head = parser.next_head()

    assert head is not None and head.status == 200
    assert parser.body is not None and parser.body.pull() == payload
