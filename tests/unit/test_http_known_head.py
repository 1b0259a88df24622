"""A stream head h11 has read whole from an answer's first bytes is known by those bytes: the next
answer that begins with them gets the very head h11 read, and everything else goes through h11."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.uds_http import response
from adapters.uds_http.response import KNOWN_HEAD, Request, ResponseParser, render
from domain.errors import ProtocolError

HEAD = (
    b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)
BODY = b'f\r\ndata: {"a":1}\n\n\r\n0\r\n\r\n'


@pytest.fixture(autouse=True)
def no_known_head() -> Iterator[None]:
    KNOWN_HEAD.clear()
    yield
    KNOWN_HEAD.clear()


class Counted:
    """How many h11 connections the parsers made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        made = Request.connection

        def connection(request: Request) -> object:
            self.made += 1
            return made(request)

        monkeypatch.setattr(response.Request, "connection", connection)


def read(pieces: list[bytes], header_bytes: int = 16384) -> tuple[int, tuple[tuple[str, str], ...], bytes]:
    parser = ResponseParser(render("POST", "/v1/chat/completions", b"{}", header_bytes))
    feed = iter([*pieces, b""])
    head = parser.next_head()
    while head is None:
        parser.receive_data(next(feed))
        head = parser.next_head()
    assert parser.body is not None
    out = bytearray()
    while (piece := parser.body.pull()) != b"":
        if piece is None:
            parser.receive_data(next(feed))
        else:
            out += piece
    return head.status, head.headers, bytes(out)


def test_the_same_head_again_is_the_one_h11_read_and_the_body_is_read_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    h11 = Counted(monkeypatch)
    first = read([HEAD + BODY])
    assert h11.made == 1 and KNOWN_HEAD[0][0] == HEAD
    known = KNOWN_HEAD[0][1]

    again = read([HEAD + BODY[:5], BODY[5:]])

    assert again == first == (200, known.headers, b'data: {"a":1}\n\n')
    assert h11.made == 1  # the second head was not read by h11 again


@pytest.mark.parametrize(
    "pieces",
    [
        [HEAD.replace(b"llama.cpp", b"llama.cpq") + BODY],  # one byte changed
        [HEAD[:-2] + b"X-More: 1\r\n\r\n" + BODY],  # a header more
        [HEAD[:20], HEAD[20:] + BODY],  # the known bytes, but not whole in the first read
    ],
)
def test_any_other_first_bytes_are_read_by_h11(monkeypatch: pytest.MonkeyPatch, pieces: list[bytes]) -> None:
    read([HEAD + BODY])
    h11 = Counted(monkeypatch)

    status, _, body = read(pieces)

    assert (status, body, h11.made) == (200, b'data: {"a":1}\n\n', 1)


def test_a_known_head_that_fails_a_smaller_cap_is_refused_by_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    read([HEAD + BODY])
    h11 = Counted(monkeypatch)

    with pytest.raises(ProtocolError, match="over the 64-byte limit"):
        read([HEAD + BODY], header_bytes=64)
    assert h11.made == 1


@pytest.mark.parametrize(
    "pieces",
    [
        [b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + BODY],  # the head does not begin the answer
        [HEAD[:30], HEAD[30:] + BODY],  # the head came in two reads
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"],  # no stream: its length varies
    ],
)
def test_only_a_stream_head_whole_in_the_first_bytes_becomes_known(pieces: list[bytes]) -> None:
    read(pieces)
    assert KNOWN_HEAD == []
