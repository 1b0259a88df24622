"""The request bytes: h11's, refused where h11 refuses, and the h11 connection that sent them
left ready to parse the response."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.uds_http.response import ResponseParser, render

HEADER_BYTES = 16384
Headers = tuple[tuple[str, str], ...]


def h11_bytes(method: str, path: str, body: bytes | None, extra: Headers = ()) -> bytes:
    """What h11 itself sends for the request `render` builds."""
    conn = h11.Connection(h11.CLIENT)
    headers = [("Host", "localhost"), *extra]
    if body is not None:
        headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    headers.append(("Connection", "close"))
    out = conn.send(h11.Request(method=method, target=path, headers=headers))
    if body:
        out += conn.send(h11.Data(data=body))
    out += conn.send(h11.EndOfMessage())
    return bytes(out)


def h11_refuses(method: str, path: str, extra: Headers) -> bool:
    try:
        h11_bytes(method, path, None, extra)
    except (h11.LocalProtocolError, ValueError):
        return True
    return False


@pytest.mark.parametrize(
    ("method", "path", "body", "extra"),
    [
        ("POST", "/v1/chat/completions", b'{"messages":[]}', (("X-Conversation-Id", "0f" * 16),)),
        ("GET", "/slots?model=a%20b", None, ()),
        ("DELETE", "/v1/stream?conv_id=abc", None, ()),
        ("POST", "/tokenize", b"", ()),
        ("GET", "/x", None, (("X-Tab", "a\tb"), ("connection", "keep-alive"), ("X-Empty", ""))),
    ],
)
def test_the_bytes_are_exactly_what_h11_sends(method: str, path: str, body: bytes | None, extra: Headers) -> None:
    request = render(method, path, body, HEADER_BYTES, extra)

    assert request.data == h11_bytes(method, path, body, extra)
    # An h11 connection that has sent a request of this method reads the answer.
    conn = request.connection()
    assert conn.their_state is h11.SEND_RESPONSE
    conn.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    response = conn.next_event()
    assert type(response) is h11.Response
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "extra"),
    [
        ("PO ST", "/x", ()),
        ("GET", "/x y", ()),
        ("GET", "", ()),
        ("GET", "/caf\u00e9", ()),
        ("GET", "/x", (("X-A", " leading space"),)),
        ("GET", "/x", (("X-A", "line\r\nbreak"),)),
        ("GET", "/x", (("Bad Name", "v"),)),
        ("GET", "/x", (("Host", "elsewhere"),)),
        ("GET", "/x", (("X-A", "caf\u00e9"),)),
    ],
)
def test_whatever_h11_refuses_is_a_value_error(method: str, path: str, extra: Headers) -> None:
    assert h11_refuses(method, path, extra)
    with pytest.raises(ValueError):
        render(method, path, None, HEADER_BYTES, extra)


def test_a_header_h11_treats_specially_gets_h11s_bytes() -> None:
    # A duplicate Content-Length of the same value is folded into one by h11.
    extra = (("Content-Length", "2"),)
    request = render("POST", "/x", b"{}", HEADER_BYTES, extra)

    assert request.data == h11_bytes("POST", "/x", b"{}", extra)


printable = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12)


@given(method=printable, path=printable, name=printable, value=printable)
def test_any_request_is_sent_as_h11_sends_it_or_refused_as_h11_refuses_it(
    method: str, path: str, name: str, value: str
) -> None:
    extra = ((name, value),)
    if h11_refuses(method, path, extra):
        with pytest.raises(ValueError):
            render(method, path, None, HEADER_BYTES, extra)
    else:
        assert render(method, path, None, HEADER_BYTES, extra).data == h11_bytes(method, path, None, extra)


def test_the_response_is_parsed_by_the_connection_that_sent_the_request() -> None:
    request = render("POST", "/v1/chat/completions", b"{}", HEADER_BYTES, (("X-Conversation-Id", "ab"),))
    parser = ResponseParser(request)

    assert parser.next_head() is None
    parser.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    head = parser.next_head()

    assert head is not None and head.status == 200
    assert parser.body is not None and parser.body.pull() == b"{}"


def test_the_headers_listed_are_every_header_sent_in_order() -> None:
    request = render("POST", "/x", b"{}", HEADER_BYTES, (("X-A", "1"),))

    assert request.headers == (
        ("Host", "localhost"),
        ("X-A", "1"),
        ("Content-Type", "application/json"),
        ("Content-Length", "2"),
        ("Connection", "close"),
    )
    assert request.what == "POST /x"
    assert render("GET", "/y", None, HEADER_BYTES).headers == (("Host", "localhost"), ("Connection", "close"))
