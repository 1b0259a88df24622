"""The sans-IO response parser under both exchanges: bytes in, the head and the body out, the same
whatever the split, and the same errors for the same bytes."""

from __future__ import annotations

import pytest

from adapters.uds_http.response import ResponseParser, render
from domain.errors import ProtocolError, StreamClosedEarly
from ports.transport import ResponseHead

CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'f\r\ndata: {"a":1}\n\n\r\n'
    b'f\r\ndata: {"b":2}\n\n\r\n0\r\n\r\n'
)
LENGTH = b'HTTP/1.1 503 Service Unavailable\r\nContent-Length: 13\r\n\r\n{"error": 1}\n'
TO_CLOSE = b"HTTP/1.0 200 OK\r\n\r\nall of it"
INFORMATIONAL = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


def parse(pieces: list[bytes], *, header_bytes: int = 16384) -> tuple[ResponseHead, bytes]:
    """Drive the parser as an exchange does: hand bytes over only when it asks for them."""
    parser = ResponseParser(render("GET", "/x", None, header_bytes))
    feed = iter([*pieces, b""])
    head = parser.next_head()
    while head is None:
        parser.receive_data(next(feed))
        head = parser.next_head()
    body = parser.body
    assert body is not None
    out = bytearray()
    while True:
        piece = body.pull()
        if piece is None:
            parser.receive_data(next(feed))
            continue
        if piece == b"":
            return head, bytes(out)
        out += piece


@pytest.mark.parametrize("raw", [CHUNKED, LENGTH, TO_CLOSE, INFORMATIONAL], ids=["chunked", "length", "close", "100"])
def test_every_split_gives_the_same_head_and_body(raw: bytes) -> None:
    whole = parse([raw])
    assert parse([bytes([b]) for b in raw]) == whole
    for cut in range(1, len(raw)):
        assert parse([raw[:cut], raw[cut:]]) == whole, cut


def test_the_head_and_body_are_read_as_sent() -> None:
    head, body = parse([CHUNKED])

    assert head.status == 200
    assert head.header("content-type") == "text/event-stream"
    assert body == b'data: {"a":1}\n\ndata: {"b":2}\n\n'


def test_a_head_over_the_cap_is_refused_and_stays_refused() -> None:
    raw = b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * 300 + b"\r\n\r\n"
    parser = ResponseParser(render("GET", "/x", None, 128))
    parser.receive_data(raw)

    with pytest.raises(ProtocolError, match="128-byte limit"):
        parser.next_head()
    with pytest.raises(ProtocolError):
        parser.next_head()


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@pytest.mark.parametrize("whole", [True, False], ids=["in-one-read", "one-by-one"])
def test_informational_responses_past_the_cap_are_refused(whole: bool) -> None:
    # A final head never comes: the 1xx heads alone count against `header_bytes`.
    parser = ResponseParser(render("GET", "/x", None, 128))
    pieces = [CONTINUE * 6] if whole else [CONTINUE] * 6  # 150 bytes

    with pytest.raises(
        ProtocolError, match=r"GET /x: 150 bytes of informational \(1xx\) responses and no response head"
    ):
        for piece in pieces:
            parser.receive_data(piece)
            assert parser.next_head() is None
    with pytest.raises(ProtocolError, match="already refused"):
        parser.next_head()


def test_informational_responses_of_exactly_the_cap_are_not_refused_one_byte_more_is() -> None:
    at_cap = ResponseParser(render("GET", "/x", None, 4 * len(CONTINUE)))
    at_cap.receive_data(CONTINUE * 4)
    assert at_cap.next_head() is None

    over = ResponseParser(render("GET", "/x", None, 4 * len(CONTINUE) - 1))
    over.receive_data(CONTINUE * 4)
    with pytest.raises(ProtocolError, match="informational"):
        over.next_head()


def test_the_body_bytes_after_a_head_at_the_cap_do_not_count_against_it() -> None:
    final = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    parser = ResponseParser(render("GET", "/x", None, 2 * len(CONTINUE) + len(final)))
    parser.receive_data(CONTINUE * 2 + final + b"hello")

    head = parser.next_head()
    assert head is not None
    assert head.status == 200


def test_informational_responses_and_the_head_within_the_cap_are_read() -> None:
    final = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    parser = ResponseParser(render("GET", "/x", None, 4 * len(CONTINUE) + len(final)))
    parser.receive_data(CONTINUE * 4 + final)

    head = parser.next_head()
    assert head is not None
    assert head.status == 200


def test_eof_inside_the_head_says_where() -> None:
    parser = ResponseParser(render("GET", "/x", None, 16384))
    assert parser.next_head() is None
    parser.receive_data(b"HTTP/1.1 200 OK\r\nContent-")
    assert parser.next_head() is None
    parser.receive_data(b"")

    with pytest.raises(StreamClosedEarly, match="GET /x: connection closed inside the response head after 25 bytes"):
        parser.next_head()


def test_eof_before_any_byte_says_so() -> None:
    parser = ResponseParser(render("GET", "/x", None, 16384))
    assert parser.next_head() is None
    parser.receive_data(b"")

    with pytest.raises(StreamClosedEarly, match="before any response byte"):
        parser.next_head()


def test_a_failure_names_where_in_the_response_it_happened() -> None:
    parser = ResponseParser(render("POST", "/v1/chat/completions", b"{}", 16384))
    parser.receive_data(CHUNKED[:100])
    assert parser.next_head() is not None
    assert parser.body is not None
    while parser.body.pull():
        pass

    error = parser.failure(ConnectionResetError(104, "Connection reset by peer"))

    assert str(error) == (
        "POST /v1/chat/completions: connection failed after chunk 1 (15 body bytes), before the terminating"
        " zero-size chunk (ECONNRESET: Connection reset by peer)"
    )


def test_a_complete_head_over_the_cap_is_refused_though_it_came_in_one_read() -> None:
    # h11 caps only a head still incomplete: a whole one that came at once is measured here.
    parser = ResponseParser(render("GET", "/x", None, 64))
    parser.receive_data(CHUNKED)

    refused = r"GET /x: response head of 8\d bytes is over the 64-byte limit"
    with pytest.raises(ProtocolError, match=refused):
        parser.next_head()


def test_a_header_is_looked_up_by_any_case_and_its_first_value_wins() -> None:
    head = ResponseHead(200, (("x-a", "1"), ("content-type", "text/plain"), ("x-a", "2")))
    assert (head.header("X-A"), head.header("Content-Type"), head.header("x-b")) == ("1", "text/plain", None)
    assert head == ResponseHead(200, head.headers)
    assert hash(head) == hash(ResponseHead(200, head.headers))
    assert repr(head) == f"ResponseHead(status=200, headers={head.headers!r})"
