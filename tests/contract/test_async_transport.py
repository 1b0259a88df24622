"""The asyncio transport against the blocking one: the same bytes from the fake server give the
same head, the same body pieces and the same errors, word for word, because both drive one
sans-IO response parser. Also what only the asyncio side has: a timeout that hands nothing over,
and cancellation that closes the connection at once.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from adapters.fake_server import End, FakeServer, Piece, Raw, RouteItem, json_reply, silence, sse_reply
from adapters.system import AsyncSystemClock, SystemClock
from adapters.uds_http._async.transport import AsyncUdsTransport
from adapters.uds_http._sync.transport import UdsTransport
from adapters.uds_http.sockets import AsyncSocketStream
from app._async.fetch import AsyncHttpSlotProbe
from app._async.fetch import fetch as fetch_async
from app._sync.fetch import HttpSlotProbe, fetch
from client_support import refuse_unread
from domain.bodies import FetchLimits
from domain.errors import InferError
from ports import AsyncExchange, AsyncTransport
from ports.transport import TIMED_OUT

pytestmark = [pytest.mark.timeout(20), pytest.mark.asyncio]

CHAT = "/v1/chat/completions"
HEADER_BYTES = 256
LIMITS = FetchLimits(head_wait_s=0.3, body_wait_s=0.3, body_bytes=1024, error_body_bytes=64)

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
ANSWERS: dict[str, RouteItem] = {
    "json": json_reply({"ok": True, "n": list(range(20))}),
    "chunked": sse_reply([{"a": 1}, {"b": 2}]),
    "error-503": json_reply({"error": {"code": 503, "message": "Loading model"}}, 503),
    "head-over-cap": Raw([Piece(0.0, HEAD + b"X-Big: " + b"x" * 400 + b"\r\n\r\n{}")]),
    "malformed-head": Raw([Piece(0.0, b"HTTP/1.1 2OO OK\r\n\r\n")]),
    "closed-in-head": Raw([Piece(0.0, b"HTTP/1.1 200 OK\r\nContent-")]),
    "closed-before-a-byte": Raw([], End.CLOSE),
    "length-short": Raw([Piece(0.0, HEAD + b"Content-Length: 10\r\n\r\n{}")]),
    "both-framings": Raw([Piece(0.0, HEAD + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}")]),
    "bad-chunk-size": Raw([Piece(0.0, HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")]),
    "cut-inside-a-chunk": Raw([Piece(0.0, HEAD + b"Transfer-Encoding: chunked\r\n\r\n10\r\nabc")]),
    "body-over-cap": Raw([Piece(0.0, HEAD + b"Content-Length: 2000\r\n\r\n")]),
    "read-to-close-over-cap": Raw([Piece(0.0, HEAD + b"\r\n" + b"x" * 2000)]),
    "silent": silence(),
    "slow-body": Raw([Piece(0.0, HEAD + b"Content-Length: 4\r\n\r\n{"), Piece(0.6, b"}")], End.SILENCE),
}


def sync_outcome(server: FakeServer) -> tuple[str, str]:
    transport = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES)
    try:
        return "ok", fetch(transport, SystemClock(), "GET", "/x", None, LIMITS).decode()
    except InferError as exc:
        return type(exc).__name__, str(exc)


async def async_outcome(server: FakeServer) -> tuple[str, str]:
    transport = AsyncUdsTransport(server.socket_path, header_bytes=HEADER_BYTES)
    try:
        return "ok", (await fetch_async(transport, AsyncSystemClock(), "GET", "/x", None, LIMITS)).decode()
    except InferError as exc:
        return type(exc).__name__, str(exc)


def same_but_the_times(one: tuple[str, str], other: tuple[str, str]) -> bool:
    # "body incomplete after 300 ms": the deadline left is measured, not fixed
    return (one[0], re.sub(r"\d+ ms", "T ms", one[1])) == (other[0], re.sub(r"\d+ ms", "T ms", other[1]))


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=ANSWERS.keys())
async def test_the_same_bytes_give_the_same_answer_or_the_same_error(server: FakeServer, answer: RouteItem) -> None:
    server.route("GET", "/x", answer)

    expected = sync_outcome(server)
    got = await async_outcome(server)

    assert got == expected or same_but_the_times(got, expected)
    assert all(r.client_closed.wait(1.0) for r in server.requests), "every connection is closed"


async def test_a_missing_socket_is_the_same_connect_error(tmp_path: Path) -> None:
    path = str(tmp_path / "nobody.sock")
    with pytest.raises(InferError) as sync_error:
        UdsTransport(path, header_bytes=HEADER_BYTES).open("GET", "/x", None, timeout=1.0)
    with pytest.raises(InferError) as async_error:
        await AsyncUdsTransport(path, header_bytes=HEADER_BYTES).open("GET", "/x", None, timeout=1.0)

    assert (type(async_error.value), str(async_error.value)) == (type(sync_error.value), str(sync_error.value))


async def test_the_request_bytes_are_the_blocking_transports(server: FakeServer) -> None:
    server.route("POST", CHAT, json_reply({}))
    UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("POST", CHAT, b'{"a":1}', timeout=1.0).close()
    exchange = await AsyncUdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open(
        "POST", CHAT, b'{"a":1}', timeout=1.0
    )
    exchange.close()
    deadline = time.monotonic() + 2.0
    while len(server.requests) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)

    first, second = server.requests
    assert (first.target, first.headers, first.body) == (second.target, second.headers, second.body)


async def test_a_timeout_hands_nothing_over_and_the_next_read_goes_on(server: FakeServer) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = [b"7\r\ndata: 1\r\n", b"7\r\ndata: 2\r\n", b"7\r\ndata: 3\r\n0\r\n\r\n"]
    server.route("POST", CHAT, Raw([Piece(0.15, head), *(Piece(0.15, c) for c in chunks)]))
    transport: AsyncTransport = AsyncUdsTransport(server.socket_path, header_bytes=16384)
    exchange: AsyncExchange = await transport.open("POST", CHAT, b"{}", timeout=1.0)
    try:
        assert await exchange.head(0.02) is TIMED_OUT
        head = await exchange.head(1.0)
        assert head is not TIMED_OUT and head.status == 200
        assert await exchange.read(0.02) is TIMED_OUT
        pieces = []
        while piece := await exchange.read(1.0):
            assert piece is not TIMED_OUT
            pieces.append(piece)
    finally:
        exchange.close()

    assert b"".join(p for p in pieces if isinstance(p, bytes)).count(b"data: ") == 3


async def test_cancelling_a_read_closes_the_connection_when_the_owner_closes(server: FakeServer) -> None:
    server.route("POST", CHAT, silence())
    exchange = await AsyncUdsTransport(server.socket_path, header_bytes=16384).open("POST", CHAT, b"{}", timeout=1.0)
    task = asyncio.create_task(exchange.head(5.0))
    await asyncio.sleep(0.05)

    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    exchange.close()
    ended_in = time.monotonic() - cancelled_at

    assert ended_in < 0.1
    (request,) = server.requests
    assert request.client_closed.wait(1.0)
    with pytest.raises(InferError, match="exchange already closed"):
        await exchange.read(0.1)


SLOTS_ANSWERS: dict[str, RouteItem] = {
    "busy": json_reply([{"id": 0, "is_processing": True}]),
    "idle": json_reply([{"id": 0, "is_processing": False}]),
    "loading": json_reply({"error": {"code": 503, "message": "Loading model"}}, 503),
    "silent": silence(),
    "malformed": Raw([Piece(0.0, HEAD + b"Content-Length: 3\r\n\r\n[{]")]),
    "no-entry": json_reply([{"id": 1, "is_processing": True}]),
}


@pytest.mark.parametrize("answer", SLOTS_ANSWERS.values(), ids=SLOTS_ANSWERS.keys())
async def test_the_async_slot_probe_answers_as_the_blocking_one(server: FakeServer, answer: RouteItem) -> None:
    server.route("GET", "/slots", answer)
    limits = FetchLimits(0.1, 0.1, 1024, 4096)
    blocking = HttpSlotProbe(UdsTransport(server.socket_path, header_bytes=HEADER_BYTES), SystemClock(), limits)
    aio = AsyncHttpSlotProbe(
        AsyncUdsTransport(server.socket_path, header_bytes=HEADER_BYTES), AsyncSystemClock(), limits
    )

    assert await aio.state(0) is blocking.state(0)
    first, second = server.requests
    assert (first.target, first.headers) == (second.target, second.headers)


async def test_a_request_on_a_connection_made_ahead_is_the_blocking_transports(server: FakeServer) -> None:
    server.route("POST", CHAT, json_reply({"ok": True}))
    sync_transport = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES)
    sync_link = sync_transport.connect(1.0)
    got_sync = fetch(sync_transport, SystemClock(), "POST", CHAT, b'{"a":1}', LIMITS)  # its own connection
    sync_transport.open("POST", CHAT, b'{"a":1}', timeout=1.0, link=sync_link).close()
    transport = AsyncUdsTransport(server.socket_path, header_bytes=HEADER_BYTES)
    link = await transport.connect(1.0)
    exchange = await transport.open("POST", CHAT, b'{"a":1}', timeout=1.0, link=link)
    head = await exchange.head(1.0)
    body = await exchange.read(1.0)
    exchange.close()
    assert not isinstance(head, type(TIMED_OUT)) and head.status == 200
    assert body == got_sync
    deadline = time.monotonic() + 2.0
    while len(server.requests) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    bodies = {(r.target, r.body) for r in server.requests}
    assert bodies == {(CHAT, b'{"a":1}')}


async def test_a_malformed_request_closes_the_async_connection_made_ahead(server: FakeServer) -> None:
    transport = AsyncUdsTransport(server.socket_path, header_bytes=HEADER_BYTES)
    link = await transport.connect(1.0)
    with pytest.raises(ValueError):
        await transport.open("BAD METHOD", CHAT, b"{}", timeout=1.0, link=link)
    assert isinstance(link, AsyncSocketStream)
    assert link._sock.fileno() == -1
    assert server.requests == []


async def test_an_answer_sent_before_the_server_broke_off_the_request_is_the_answer_as_in_the_blocking_one(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "refuses.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    refuser = threading.Thread(target=lambda: refuse_unread(listener.accept()[0]))
    refuser.start()
    try:
        exchange = await AsyncUdsTransport(path, header_bytes=16384).open("POST", "/x", b"x" * (8 << 20), timeout=2.0)
        try:
            head = await exchange.head(1.0)
            assert not isinstance(head, type(TIMED_OUT))
            assert head.status == 413
        finally:
            exchange.close()
    finally:
        refuser.join(2.0)
        listener.close()
