"""A `CancelToken` or `aclose()` ends an asyncio call even while it waits in a transport that
ties nothing to the call's cancel signal, as `ports.transport` allows (cancelling the awaiting
task ends its waits): the token's wake-up cancels the task while it waits inside the call, the
call raises `Cancelled` (or `ClientClosed`) at once, and the task is not left cancelling.

The transport is the Unix-socket one with `cancel=` dropped, so its exchanges are never aborted
by the token; the server answers nothing or streams one event and then falls silent.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from adapters.fake_server import End, FakeServer, RecordedRequest, Script, silence, sse_reply
from adapters.uds_http._async.transport import AsyncUdsTransport
from app.async_client import AsyncClient
from client_support import CHAT, PROPS, REQ, chunk, config_for, overridden, recorded
from domain.cancel import CancelToken
from domain.errors import Cancelled, ClientClosed
from domain.events import ChatEvent
from ports.transport import AsyncExchange, CancelSignal, Link

pytestmark = [pytest.mark.timeout(10), pytest.mark.asyncio]

WITHIN_S = 0.1
CLOSE_WITHIN_S = 0.3


class UnwatchedTransport:
    """The Unix-socket transport, its exchanges tied to no cancel signal."""

    def __init__(self, socket_path: str) -> None:
        self._inner = AsyncUdsTransport(socket_path, header_bytes=16384)

    async def connect(self, timeout: float, cancel: CancelSignal | None = None) -> Link:
        return await self._inner.connect(timeout, cancel)

    def close(self) -> None:
        self._inner.close()

    async def open(
        self, method: str, path: str, body: bytes | None = None, *, cancel: CancelSignal | None = None, **options: Any
    ) -> AsyncExchange:
        return await self._inner.open(method, path, body, **options)


async def until(condition: Any, within_s: float = 2.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.002)


def unanswered(server: FakeServer, method: str, path: str) -> threading.Event:
    """Route `method path` to silence; the event is set once the server has the request."""
    arrived = threading.Event()

    def reply(request: RecordedRequest) -> Script:
        arrived.set()
        return silence()

    server.route(method, path, reply)
    return arrived


async def ended(task: asyncio.Task[Any]) -> None:
    await asyncio.wait({task}, timeout=2.0)
    if not task.done():
        task.cancel()
        pytest.fail("the call did not end")


@pytest.fixture
def aio(server: FakeServer) -> Any:
    with overridden() as make:
        config = config_for(server.socket_path, liveness_ms=2000, load_wait_ms=2000, poll_ms=2000)
        client: AsyncClient = make(config, async_transport=UnwatchedTransport(server.socket_path)).async_client()
        yield client


async def test_a_token_ends_a_chat_streaming_through_a_transport_that_does_not_watch_it(
    server: FakeServer, aio: AsyncClient
) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    token = CancelToken()
    events: list[ChatEvent] = []
    task = asyncio.create_task(aio.chat(REQ, events.append, cancel=token))
    await until(lambda: bool(events))
    await asyncio.sleep(0.02)  # back in its read

    cancelled_at = time.monotonic()
    threading.Thread(target=token.cancel).start()
    await ended(task)

    assert time.monotonic() - cancelled_at < WITHIN_S
    assert type(task.exception()) is Cancelled
    assert task.cancelling() == 0, "the task's cancellation is taken back"
    assert recorded(server, CHAT)[0].client_closed.wait(1.0), "the stream's connection is closed"
    assert not aio._gate.held(0)


async def test_a_token_ends_a_small_call_through_a_transport_that_does_not_watch_it(
    server: FakeServer, aio: AsyncClient
) -> None:
    asked = unanswered(server, *PROPS)
    token = CancelToken()
    task = asyncio.create_task(aio.props(cancel=token))
    await until(asked.is_set)

    cancelled_at = time.monotonic()
    threading.Thread(target=token.cancel).start()
    await ended(task)

    assert time.monotonic() - cancelled_at < WITHIN_S
    assert type(task.exception()) is Cancelled
    assert task.cancelling() == 0
    assert recorded(server, PROPS)[0].client_closed.wait(1.0)


async def test_aclose_ends_the_calls_waiting_in_a_transport_that_does_not_watch_their_tokens(
    server: FakeServer, aio: AsyncClient
) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    asked = unanswered(server, *PROPS)
    events: list[ChatEvent] = []
    chat = asyncio.create_task(aio.chat(REQ, events.append))
    props = asyncio.create_task(aio.props())
    await until(lambda: bool(events) and asked.is_set())

    closed_at = time.monotonic()
    await aio.aclose()
    closed_in = time.monotonic() - closed_at
    await ended(chat)
    await ended(props)

    assert closed_in < CLOSE_WITHIN_S
    assert type(chat.exception()) is ClientClosed
    assert type(props.exception()) is ClientClosed
    assert chat.cancelling() == props.cancelling() == 0
    assert all(request.client_closed.wait(1.0) for request in server.requests)
    assert not aio._gate.held(0)
