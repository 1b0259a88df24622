"""Every phase of a call can be ended: by the caller's `CancelToken` (`Cancelled`) or by
`close()` (`ClientClosed`), in both flavours.

The phases `test_client_cancel` does not reach: writing a request the server does not read, the
`/props` lookup a chat makes when the config gives no slot count, the small calls (`props`,
`slots`, `tokenize`, `render`), a caller queued at the local slot gate (bounded by `busy_wait_ms`), many
callers queued when `close()` comes (none of them may send its request), and the caller's own
`on_event` ending the call. Each test runs over both clients (`client_kind`); the ones marked
`sync_only` build their own `AsyncClient` and run its calls as tasks on one loop, which the
blocking bridge cannot. The limits a test names are 50-200 ms; latency is measured from `cancel()` (or `close()`)
to the call's return.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import socket
import struct
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import pytest

from adapters.fake_server import End, FakeServer, RecordedRequest, Script, json_reply, silence, sse_reply
from app.async_client import AsyncClient
from app.client import Client
from app.container import Container
from client_support import (
    ANSWER,
    ANSWER_COMPLETION,
    ANSWER_EVENTS,
    CHAT,
    PROPS,
    REQ,
    SLOTS,
    Kind,
    chunk,
    config_for,
    recorded,
)
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.errors import Cancelled, ClientClosed, WaitTimeout
from domain.events import ChatEvent, Queued
from domain.llama_api import TOKENIZE_PATH
from domain.messages import ChatRequest, UserMessage

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("client_kind")]

# The promise is 100 ms from cancel (or close) to return.
WITHIN_S = 0.1
# `close()` waits at most `CLOSE_WAIT_S` (0.3 s) for the calls it ended.
CLOSE_WITHIN_S = 0.3

# Several MiB of prompt: far more than a Unix socket's buffers hold, so a server that does not
# read leaves the client blocked in its write.
BIG_REQ = ChatRequest(slot=0, messages=(UserMessage("Paris " * (1 << 20)),))
PROPS_6 = {"chat_template": "t", "total_slots": 6, "default_generation_settings": {"n_ctx": 4096}}


def ignore(event: ChatEvent) -> None:
    return None


class Outcome:
    """A call run in a thread of its own (once `start` is set, if given): what it returned or
    raised, and when it ended."""

    def __init__(self, call: Callable[[], object], start: threading.Event | None = None) -> None:
        self.value: object = None
        self.error: BaseException | None = None
        self.ended_at = 0.0
        self.done = threading.Event()
        self._call = call
        self._start = start
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self._start is not None:
                assert self._start.wait(3.0)
            self.value = self._call()
        except BaseException as exc:
            self.error = exc
        self.ended_at = time.monotonic()
        self.done.set()

    def join(self, timeout: float = 3.0) -> None:
        assert self.done.wait(timeout), "the call did not end"
        self._thread.join(timeout)


def until(condition: Callable[[], bool], within_s: float = 3.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.002)


async def until_async(condition: Callable[[], bool], within_s: float = 3.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.002)


def heard(server: FakeServer, method: str, path: str) -> threading.Event:
    """Route `method path` to silence (the request is read, never answered); the event is set
    once the server has the whole request."""
    arrived = threading.Event()

    def reply(request: RecordedRequest) -> Script:
        arrived.set()
        return silence()

    server.route(method, path, reply)
    return arrived


# -- a server that never reads --------------------------------------------------------------------


class DeafListener:
    """A Unix socket that accepts connections and never reads from them: a client writing a
    large request blocks once the socket's buffers are full. Has the `socket_path` the client
    helpers read from a server."""

    def __init__(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="deaf-llama-")
        self.socket_path = os.path.join(self._folder, "llama.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.socket_path)
        self._listener.listen(8)
        self._conns: list[socket.socket] = []

    def __enter__(self) -> DeafListener:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for conn in self._conns:
            conn.close()
        self._listener.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def blocked_writer(self) -> socket.socket:
        """The next connection, once its writer is stuck: bytes are queued and no more come."""
        self._listener.settimeout(3.0)
        conn, _ = self._listener.accept()
        self._conns.append(conn)
        last = -1
        deadline = time.monotonic() + 3.0
        while True:
            queued = _queued(conn)
            if queued > 0 and queued == last:
                return conn
            assert time.monotonic() < deadline, "the client never filled the socket's buffers"
            last = queued
            time.sleep(0.02)

    @staticmethod
    def saw_close(conn: socket.socket, within_s: float = 1.0) -> bool:
        """Whether the client's end is shut: the queued bytes drain to EOF within `within_s`."""
        conn.settimeout(within_s)
        with contextlib.suppress(OSError):
            while conn.recv(1 << 20):
                pass
            return True
        return False


def _queued(conn: socket.socket) -> int:
    raw = fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0\0\0\0")
    queued: int = struct.unpack("i", raw)[0]
    return queued


def deaf_client(kind: Kind, deaf: DeafListener, **options: Any) -> Client:
    return kind.client_of(Container(config=config_for(deaf.socket_path, **options)))


# -- 1. writing the request -----------------------------------------------------------------------


def test_cancel_while_the_request_is_written_ends_the_call_at_once(client_kind: Kind) -> None:
    with DeafListener() as deaf:
        client = deaf_client(client_kind, deaf, poll_ms=200)
        token = CancelToken()
        call = Outcome(lambda: client.chat(BIG_REQ, ignore, cancel=token))
        conn = deaf.blocked_writer()

        cancelled_at = time.monotonic()
        token.cancel()
        call.join()

        assert type(call.error) is Cancelled, call.error
        assert call.ended_at - cancelled_at < WITHIN_S
        assert deaf.saw_close(conn), "the connection was shut"


def test_close_while_the_request_is_written_ends_the_call_at_once(client_kind: Kind) -> None:
    with DeafListener() as deaf:
        client = deaf_client(client_kind, deaf, poll_ms=200)
        call = Outcome(lambda: client.chat(BIG_REQ, ignore))
        conn = deaf.blocked_writer()

        closed_at = time.monotonic()
        client.close()
        call.join()

        assert type(call.error) is ClientClosed, call.error
        assert call.ended_at - closed_at < WITHIN_S
        assert deaf.saw_close(conn)


# -- 2. the /props lookup of a chat ---------------------------------------------------------------


def test_cancel_during_the_props_lookup_of_a_chat_ends_it_at_once(server: FakeServer, client_kind: Kind) -> None:
    asked = heard(server, *PROPS)
    client = client_kind.client_for(server, expect=False, load_wait_ms=200)
    token = CancelToken()
    call = Outcome(lambda: client.chat(REQ, ignore, cancel=token))
    assert asked.wait(3.0)

    cancelled_at = time.monotonic()
    token.cancel()
    call.join()

    assert type(call.error) is Cancelled, call.error
    assert call.ended_at - cancelled_at < WITHIN_S
    (lookup,) = recorded(server, PROPS)
    assert lookup.client_closed.wait(1.0)
    assert recorded(server, CHAT) == [], "the cancelled chat was never sent"


def test_close_during_the_props_lookup_of_a_chat_ends_it_at_once(server: FakeServer, client_kind: Kind) -> None:
    asked = heard(server, *PROPS)
    client = client_kind.client_for(server, expect=False, load_wait_ms=200)
    call = Outcome(lambda: client.chat_with_retry(REQ, ignore))
    assert asked.wait(3.0)

    closed_at = time.monotonic()
    client.close()
    call.join()

    assert type(call.error) is ClientClosed, call.error
    assert call.ended_at - closed_at < WITHIN_S
    assert len(recorded(server, PROPS)) == 1, "no retry after close"
    assert recorded(server, CHAT) == []


# -- 3. props, slots, tokenize, render -----------------------------------------------------------

# name: (route, a well-formed answer, the call). The clients have no [expect], so `render` asks
# /props for the slot count.
SMALL_CALLS: dict[str, tuple[tuple[str, str], object, Callable[..., Any]]] = {
    "props": (PROPS, PROPS_6, lambda client, **kw: client.props(**kw)),
    "slots": (SLOTS, [{"id": 0, "is_processing": False}], lambda client, **kw: client.slots(**kw)),
    "tokenize": (
        ("POST", TOKENIZE_PATH),
        {"tokens": [{"id": 42, "piece": "Paris"}]},
        lambda client, **kw: client.tokenize("Paris", **kw),
    ),
    "render": (PROPS, PROPS_6, lambda client, **kw: client.render(REQ, **kw)),
}
small_calls = pytest.mark.parametrize("name", list(SMALL_CALLS))


@small_calls
def test_a_small_call_on_a_closed_client_raises_client_closed_without_connecting(
    server: FakeServer, name: str, client_kind: Kind
) -> None:
    route, answer, call = SMALL_CALLS[name]
    server.route(*route, json_reply(answer))
    client = client_kind.client_for(server, expect=False)
    client.close()

    with pytest.raises(ClientClosed):
        call(client)
    with pytest.raises(ClientClosed):
        call(client, cancel=CancelToken())

    assert server.requests == []


@small_calls
def test_close_ends_a_small_call_in_flight(server: FakeServer, name: str, client_kind: Kind) -> None:
    route, _, call = SMALL_CALLS[name]
    asked = heard(server, *route)
    client = client_kind.client_for(server, expect=False, load_wait_ms=200)
    running = Outcome(lambda: call(client))
    assert asked.wait(3.0)

    closed_at = time.monotonic()
    client.close()
    running.join()

    assert type(running.error) is ClientClosed, running.error
    assert running.ended_at - closed_at < CLOSE_WITHIN_S
    (request,) = server.requests
    assert request.client_closed.wait(1.0)


@small_calls
def test_a_cancel_token_ends_a_small_call_in_flight(server: FakeServer, name: str, client_kind: Kind) -> None:
    route, _, call = SMALL_CALLS[name]
    asked = heard(server, *route)
    client = client_kind.client_for(server, expect=False, load_wait_ms=200)
    token = CancelToken()
    running = Outcome(lambda: call(client, cancel=token))
    assert asked.wait(3.0)

    cancelled_at = time.monotonic()
    token.cancel()
    running.join()

    assert type(running.error) is Cancelled, running.error
    assert running.ended_at - cancelled_at < WITHIN_S
    (request,) = server.requests
    assert request.client_closed.wait(1.0)


@small_calls
def test_a_token_cancelled_before_a_small_call_sends_nothing(server: FakeServer, name: str, client_kind: Kind) -> None:
    route, answer, call = SMALL_CALLS[name]
    server.route(*route, json_reply(answer))
    client = client_kind.client_for(server, expect=False)
    token = CancelToken()
    token.cancel()

    with pytest.raises(Cancelled) as caught:
        call(client, cancel=token)

    assert type(caught.value) is Cancelled
    assert server.requests == []
    assert server.accepted == 0, "not even a connection: the proxy would count it against its accept rate"


def test_a_token_cancelled_before_a_render_that_needs_no_request_ends_it_too(
    server: FakeServer, client_kind: Kind
) -> None:
    client = client_kind.client_for(server)  # [expect] gives the slot count: nothing to ask
    token = CancelToken()
    token.cancel()

    with pytest.raises(Cancelled):
        client.render(REQ, cancel=token)
    assert client.render(REQ) == client.render(REQ, cancel=CancelToken()), "a live token renders"
    assert server.accepted == 0


@small_calls
@pytest.mark.sync_only("an asyncio test: the close comes from another task on the call's loop")
@pytest.mark.asyncio
async def test_aclose_from_another_task_ends_a_small_call_in_flight(server: FakeServer, name: str) -> None:
    route, _, call = SMALL_CALLS[name]
    asked = heard(server, *route)
    client = Container(config=config_for(server.socket_path, expect=False, load_wait_ms=200)).async_client()
    task: asyncio.Future[object] = asyncio.ensure_future(call(client))
    await until_async(asked.is_set)

    closed_at = time.monotonic()
    await client.aclose()
    with pytest.raises(ClientClosed):
        await task

    assert time.monotonic() - closed_at < CLOSE_WITHIN_S
    (request,) = server.requests
    assert request.client_closed.wait(1.0)


# -- 4. close() against many queued callers -------------------------------------------------------

SLOT_COUNT = 6
QUEUED_PER_SLOT = 8
ROUNDS = 5
# Only close() may end a call here: forty-eight callers take well over 200 ms to queue on a busy
# machine, and a holder's stream can pause that long, so no limit is near enough to trip first.
CLOSE_ALONE_ENDS = {"liveness_ms": 5000, "busy_wait_ms": 5000}


def busy_server(server: FakeServer) -> None:
    """Six slots (from /props); the first six chats stream for seconds, any later one would get
    a whole answer at once."""
    server.route(*PROPS, json_reply(PROPS_6))
    long = sse_reply([chunk({"content": "x"}) for _ in range(100)], delay_s=0.05, done=False, end=End.SILENCE)
    server.route(*CHAT, *([long] * SLOT_COUNT), sse_reply(ANSWER))


def slot_req(slot: int) -> ChatRequest:
    return ChatRequest(slot=slot, messages=REQ.messages)


def all_queued(client: Client | AsyncClient) -> bool:
    return all(client._gate.waiting(slot) == QUEUED_PER_SLOT for slot in range(SLOT_COUNT))


def close_with_callers_queued(kind: Kind) -> tuple[int, list[Outcome]]:
    """One round: every slot held by a stream, eight callers queued on each, then `close()`; the
    chat requests the server received, and every call's outcome."""
    with FakeServer() as server:
        busy_server(server)
        client = kind.client_for(server, expect=False, queue_per_slot=16, **CLOSE_ALONE_ENDS)

        def call(slot: int, streaming: threading.Event | None = None, start: threading.Event | None = None) -> Outcome:
            sink = ignore if streaming is None else lambda event: streaming.set()
            return Outcome(lambda: client.chat(slot_req(slot), sink), start)

        streaming = [threading.Event() for _ in range(SLOT_COUNT)]
        holders = [call(slot, streaming[slot]) for slot in range(SLOT_COUNT)]
        assert all(event.wait(3.0) for event in streaming)
        # The threads are started first and then let go at once, so the queue forms soon.
        go = threading.Event()
        queued = [call(slot, start=go) for slot in range(SLOT_COUNT) for _ in range(QUEUED_PER_SLOT)]
        go.set()
        until(lambda: all_queued(client))

        client.close()
        for outcome in holders + queued:
            outcome.join()
        return len(recorded(server, CHAT)), holders + queued


def test_no_queued_call_sends_its_request_once_close_has_begun(client_kind: Kind) -> None:
    # Each caller in a thread of its own (with the async client: on a loop of its own).
    for _ in range(ROUNDS):
        sent, outcomes = close_with_callers_queued(client_kind)

        assert sent == SLOT_COUNT, "a queued call sent its request after close()"
        assert not any(isinstance(o.value, Completion) for o in outcomes)
        assert all(type(o.error) is ClientClosed for o in outcomes), [o.error for o in outcomes]


async def aclose_with_tasks_queued() -> tuple[int, list[object]]:
    """`close_with_callers_queued` with every caller a task on this loop, and `aclose()`."""
    with FakeServer() as server:
        busy_server(server)
        config = config_for(server.socket_path, expect=False, queue_per_slot=16, **CLOSE_ALONE_ENDS)
        client = Container(config=config).async_client()

        def call(slot: int, streaming: asyncio.Event | None = None) -> asyncio.Task[Completion]:
            sink = ignore if streaming is None else lambda event: streaming.set()
            return asyncio.create_task(client.chat(slot_req(slot), sink))

        streaming = [asyncio.Event() for _ in range(SLOT_COUNT)]
        holders = [call(slot, streaming[slot]) for slot in range(SLOT_COUNT)]
        async with asyncio.timeout(3.0):
            for event in streaming:
                await event.wait()
        queued = [call(slot) for slot in range(SLOT_COUNT) for _ in range(QUEUED_PER_SLOT)]
        await until_async(lambda: all_queued(client))

        await client.aclose()
        outcomes: list[object] = await asyncio.gather(*holders, *queued, return_exceptions=True)
        return len(recorded(server, CHAT)), outcomes


@pytest.mark.sync_only("an asyncio test: every caller is a task on one loop")
@pytest.mark.asyncio
async def test_no_queued_task_sends_its_request_once_aclose_has_begun() -> None:
    for _ in range(ROUNDS):
        sent, outcomes = await aclose_with_tasks_queued()

        assert sent == SLOT_COUNT, "a queued task sent its request after aclose()"
        assert not any(isinstance(o, Completion) for o in outcomes)
        assert all(type(o) is ClientClosed for o in outcomes), outcomes


# -- 5. the local slot gate -----------------------------------------------------------------------


def test_a_caller_queued_at_the_slot_gate_waits_at_most_busy_wait_ms(server: FakeServer, client_kind: Kind) -> None:
    # The holder streams for a second; a queued caller may wait only busy_wait_ms.
    holding = sse_reply([chunk({"content": "x"}) for _ in range(20)], delay_s=0.05)
    server.route(*CHAT, holding, sse_reply(ANSWER))
    client = client_kind.client_for(server, busy_wait_ms=150, liveness_ms=200)
    streaming = threading.Event()
    holder = Outcome(lambda: client.chat(REQ, lambda e: streaming.set()))
    assert streaming.wait(3.0)
    events: list[ChatEvent] = []

    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="busy with this client's own requests") as caught:
        client.chat(REQ, events.append)
    waited = time.monotonic() - started

    assert 0.15 <= waited < 0.15 + WITHIN_S
    assert "nothing was sent" in str(caught.value)
    assert events == [Queued(1)]
    assert len(recorded(server, CHAT)) == 1, "the queued caller sent nothing"
    assert client._gate.waiting(0) == 0
    assert not holder.done.is_set(), "the holder still runs"
    client.close()
    holder.join()


def test_time_queued_at_the_gate_and_busy_on_the_server_share_one_busy_wait_ms(
    server: FakeServer, client_kind: Kind
) -> None:
    # The holder streams for about 100 ms; the caller queued behind it then finds the slot busy
    # on the server: the slot was busy for it the whole time, and busy_wait_ms bounds it whole.
    holding = sse_reply([*(chunk({"content": "x"}) for _ in range(4)), chunk(finish="stop")], delay_s=0.025)
    server.route(*CHAT, holding, silence())
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True}]))
    client = client_kind.client_for(server, busy_wait_ms=150, poll_ms=50, liveness_ms=200)
    streaming = threading.Event()
    holder = Outcome(lambda: client.chat(REQ, lambda e: streaming.set()))
    assert streaming.wait(3.0)

    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"of it queued in this client\); no data") as caught:
        client.chat(REQ, lambda event: None)
    waited = time.monotonic() - started

    assert waited < 0.15 + 0.05 + WITHIN_S, str(caught.value)  # the limit, and the poll that found it
    holder.join()


def test_a_cancel_while_a_failed_call_stops_its_generation_still_gives_the_slot_back(
    server: FakeServer, client_kind: Kind
) -> None:
    # The call stalls after its head, and its stop (the DELETE) goes unanswered: the caller's
    # cancel lands while the stop waits. The stop runs to its bound in both flavours, the call
    # raises the cancel, and the slot is free for the next call.
    stalled = sse_reply([chunk({"content": "x"})], done=False, end=End.SILENCE)
    server.route(*CHAT, stalled, sse_reply(ANSWER))
    stopping = heard(server, "DELETE", "/v1/stream")
    client = client_kind.client_for(server, timed=True)
    token = CancelToken()
    call = Outcome(lambda: client.chat(REQ, ignore, cancel=token))
    assert stopping.wait(3.0)

    token.cancel()
    call.join()

    assert type(call.error) is Cancelled, call.error
    (stop,) = recorded(server, ("DELETE", "/v1/stream"))
    assert stop.client_closed.wait(1.0) and stop.closed_at is not None
    assert stop.closed_at - stop.time >= 0.08, "the stop waited out its bound (0.1 s here), not cut by the cancel"
    assert client._gate.waiting(0) == 0
    assert client.chat(REQ, ignore) == ANSWER_COMPLETION
    client.close()


# -- 6. the caller's on_event ---------------------------------------------------------------------


class Stop:
    """An `on_event` that raises `StopIteration`, as a generator's `next()` would at its end."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, event: ChatEvent) -> None:
        self.calls += 1
        raise StopIteration("not the answer")


@pytest.mark.parametrize("retry", [False, True], ids=["chat", "chat_with_retry"])
def test_an_on_event_raising_stop_iteration_is_an_error_and_closes_the_connection(
    server: FakeServer, retry: bool, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    client = client_kind.client_for(server, liveness_ms=200)
    stop = Stop()

    with pytest.raises(RuntimeError, match=r"on_event raised StopIteration on Content$") as caught:
        (client.chat_with_retry if retry else client.chat)(REQ, stop)

    assert isinstance(caught.value.__cause__, StopIteration)
    assert stop.calls == 1
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0), "the call's connection is closed"
    assert not client._gate.held(0)


def test_a_finished_stream_iterated_again_yields_nothing_and_keeps_its_completion(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)

    with client.stream(REQ) as s:
        assert list(s) == ANSWER_EVENTS
        assert list(s) == []
        assert s.completion == ANSWER_COMPLETION

    assert s.completion == ANSWER_COMPLETION
    assert len(recorded(server, CHAT)) == 1
