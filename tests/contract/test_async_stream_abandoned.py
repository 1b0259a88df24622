"""An async stream iterated without `async with` and left by a `break`: nothing calls its
`aclose()`, so only the garbage collector and the loop's async-generator finaliser end the call.

The sync client's `EventStream` in the same spot ends its call completely when the iterator is
dropped: the connection is closed, the slot given back and the call forgotten, so `close()` has
nothing to wait for. The async client does the same: the call's steps are an async generator
whose `finally` (run by the loop's finaliser) also forgets the call, so `aclose()` of the client
does not wait its `CLOSE_WAIT_S` (300 ms) for a call that ended long ago.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from adapters.fake_server import End, FakeServer, sse_reply
from app.container import Container
from client_support import CHAT, REQ, STOP, chunk, config_for, recorded

pytestmark = pytest.mark.timeout(10)


def abandon_a_stream_then_close(server: FakeServer) -> float:
    """Seconds `aclose()` takes after a stream was left by a `break` and collected."""
    container = Container(config=config_for(server.socket_path, liveness_ms=2000))
    aio = container.async_client()

    async def run() -> float:
        async for _ in aio.stream(REQ):
            break
        gc.collect()
        for _ in range(5):  # the loop's async-generator finaliser runs on the loop
            await asyncio.sleep(0.01)
        (stream,) = recorded(server, CHAT)
        assert stream.client_closed.wait(1.0), "the connection is closed"
        assert not container.gate().held(REQ.slot), "the slot is free"
        started = time.monotonic()
        await aio.aclose()
        return time.monotonic() - started

    return asyncio.run(run())


def test_a_stream_left_by_a_break_leaves_nothing_for_aclose_to_wait_for(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))

    assert abandon_a_stream_then_close(server) < 0.1


def test_a_sync_stream_left_by_a_break_leaves_nothing_for_close_to_wait_for(server: FakeServer) -> None:
    # The behaviour the async client is held to above.
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    container = Container(config=config_for(server.socket_path, liveness_ms=2000))
    client = container.client()

    for _ in client.stream(REQ):
        break
    gc.collect()
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0)
    assert not container.gate().held(REQ.slot)
    started = time.monotonic()
    client.close()

    assert time.monotonic() - started < 0.1


def test_a_break_as_the_last_thing_before_asyncio_run_ends_still_stops_the_generation(server: FakeServer) -> None:
    # The loop's end cancels every task, the call's end among them: its stop is made again.
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    container = Container(config=config_for(server.socket_path, liveness_ms=2000))
    aio = container.async_client()

    async def run() -> None:
        async for _ in aio.stream(REQ):
            break

    asyncio.run(run())

    assert len(recorded(server, STOP)) == 1, "the generation was stopped"
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0), "the connection is closed"
    assert not container.gate().held(REQ.slot), "the slot is free"


def test_a_stream_left_open_when_asyncio_run_ends_is_stopped_and_closed_without_an_error(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The loop's end closes every async generator at once: the call's outer steps and its inner
    # ones together, the inner already closing when the outer comes to close it.
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    container = Container(config=config_for(server.socket_path, liveness_ms=2000))
    aio = container.async_client()
    kept: list[object] = []

    async def run() -> None:
        stream = aio.stream(REQ)
        loop = aiter(stream)
        kept.append(loop)  # held past the loop's end: only the loop's own shutdown closes it
        await anext(loop)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(run())

    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert len(recorded(server, STOP)) == 1, "the generation was stopped"
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0), "the connection is closed"
    assert not container.gate().held(REQ.slot), "the slot is free"
