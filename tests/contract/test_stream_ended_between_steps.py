"""A stream whose consumer is in its own code, between two steps, when its call is cancelled (the
caller's `CancelToken`, or the client's close), in both flavours: the call ends then, not at the
next step: its generation stopped (`DELETE`), its connection closed and its slot given back,
within 100 ms; the next step raises the token's error. (A cancel in the blocking consumer's own
thread, its own code or a signal handler on top of it, is taken at the next step.) And one loop reads a stream: a second
thread or task stepping it while the first is inside a step is refused with a `RuntimeError`,
and the first reads on to the completion."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.fake_server import End, FakeServer, Reply, silence, sse_reply
from app.calls import CLOSE_WAIT_S
from app.client import Client
from app.config import parse_config
from app.container import Container
from app.event_stream import CLOSED_WHILE_READ, ONE_READER, AsyncEventStream, EventStream
from client_support import (
    ANSWER,
    ANSWER_COMPLETION,
    CHAT,
    EXPECT,
    LIMITS,
    NO_PROXY_LIMIT,
    REQ,
    RETRY,
    STOP,
    chunk,
    config_for,
    recorded,
)
from domain.cancel import CancelToken
from domain.errors import Cancelled, ClientClosed
from domain.events import ChatEvent, Content
from domain.messages import ChatRequest

pytestmark = pytest.mark.timeout(20)

WITHIN_S = 0.1
# One word, then nothing (the server goes on generating as far as the client can tell).
HELD = sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE)
# Ten words 40 ms apart, then the final chunk. Every client here allows 5 s of silence: these
# tests are of who may read a stream, and a busy machine's scheduling gap is no stall.
SLOW = sse_reply([*(chunk({"content": f" w{n}"}, n=n) for n in range(1, 11)), chunk(finish="stop", n=11)], delay_s=0.04)


def ignore(event: ChatEvent) -> None:
    return None


def ended(server: FakeServer, gate_held: object) -> bool:
    """The call is over: its generation stopped, its slot free, and (the server's thread sees it
    a moment later) its connection closed."""
    stopped = len(recorded(server, STOP)) == 1 and not gate_held(0)  # type: ignore[operator]
    return stopped and recorded(server, CHAT)[0].client_closed.wait(WITHIN_S)


def until(condition: object, within_s: float) -> float:
    started = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - started < within_s, f"not within {within_s * 1000:.0f} ms"
        time.sleep(0.002)
    return time.monotonic() - started


async def until_async(condition: object, within_s: float) -> float:
    started = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - started < within_s, f"not within {within_s * 1000:.0f} ms"
        await asyncio.sleep(0.002)
    return time.monotonic() - started


# -- the blocking flavour ---------------------------------------------------------------------------


def held_after_one_event(server: FakeServer, token: CancelToken) -> tuple[Client, Iterator[ChatEvent]]:
    """A client, and the events of its stream under `token`, the first taken: the server then silent."""
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).client()
    events = iter(client.stream(REQ, cancel=token))
    assert next(events) == Content("Paris")
    return client, events


def test_a_cancel_from_another_thread_between_two_steps_ends_the_call_then(server: FakeServer) -> None:
    token = CancelToken()
    client, events = held_after_one_event(server, token)
    threading.Thread(target=token.cancel).start()
    until(lambda: ended(server, client._gate.held), WITHIN_S)
    with pytest.raises(Cancelled):
        next(events)
    client.close()


def test_a_cancel_in_the_consumers_own_thread_ends_the_call_at_its_next_step(server: FakeServer) -> None:
    # Its own code, or a signal handler on top of it that may have cut into a lock the end takes.
    token = CancelToken()
    client, events = held_after_one_event(server, token)
    token.cancel()
    assert recorded(server, STOP) == [], "not in the canceller's own frame"
    started = time.monotonic()
    with pytest.raises(Cancelled):
        next(events)
    assert time.monotonic() - started < WITHIN_S
    assert ended(server, client._gate.held), "ended by the time the step raised"
    client.close()


def test_close_between_two_steps_ends_the_call_before_it_returns(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).client()
    with client.stream(REQ) as stream:
        events = iter(stream)
        assert next(events) == Content("Paris")
        started = time.monotonic()
        closer = threading.Thread(target=client.close)
        closer.start()
        closer.join(1.0)
        assert time.monotonic() - started < WITHIN_S
        assert ended(server, client._gate.held)
        with pytest.raises(ClientClosed):
            next(events)


def test_chat_whose_on_event_cancels_its_token_raises_cancelled(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).client()
    token = CancelToken()
    with pytest.raises(Cancelled):
        client.chat(REQ, lambda event: token.cancel(), cancel=token)
    assert ended(server, client._gate.held)
    client.close()


def _second_reader(stream: EventStream | AsyncEventStream, how: str) -> Any:
    """A second reader's step, as `how` makes it."""
    if how == "loop":
        return next(iter(stream))  # type: ignore[arg-type]
    if how == "next":
        return next(stream)  # type: ignore[arg-type]
    return stream.run(ignore)


@pytest.mark.parametrize(
    ("reader", "second"),
    [("loop", "loop"), ("loop", "next"), ("loop", "run"), ("bare", "loop"), ("bare", "run")],
    ids=["loop-then-loop", "loop-then-next", "loop-then-run", "bare-steps-then-loop", "bare-steps-then-run"],
)
def test_a_second_thread_stepping_a_stream_being_read_is_refused(server: FakeServer, reader: str, second: str) -> None:
    server.route(*CHAT, SLOW)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).client()
    first = threading.Event()
    seen: list[ChatEvent] = []
    with client.stream(REQ) as stream:

        def read() -> None:
            if reader == "loop":
                for event in stream:
                    seen.append(event)
                    first.set()
                return
            while True:  # bare steps: no loop object counted
                try:
                    seen.append(next(stream))
                except StopIteration:
                    return
                first.set()

        thread = threading.Thread(target=read)
        thread.start()
        assert first.wait(2.0)
        until(stream._lock.locked, 1.0)  # the reader is inside its next step, waiting for the next word
        with pytest.raises(RuntimeError, match=ONE_READER):
            _second_reader(stream, second)
        thread.join(2.0)
        assert not thread.is_alive()
    assert len(seen) == 10, "the first loop read on to the end"
    assert stream.completion.content == "".join(f" w{n}" for n in range(1, 11))
    client.close()


# -- asyncio ----------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("by", ["another thread", "the loop's own thread"])
async def test_an_async_cancel_between_two_steps_ends_the_call_then(server: FakeServer, by: str) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    token = CancelToken()
    async with client.stream(REQ, cancel=token) as stream:
        assert await anext(stream) == Content("Paris")
        if by == "another thread":
            threading.Thread(target=token.cancel).start()
        else:
            token.cancel()
        await until_async(lambda: ended(server, client._gate.held), WITHIN_S)  # the consumer awaits elsewhere
        with pytest.raises(Cancelled):
            await anext(stream)
    await client.aclose()


@pytest.mark.asyncio
async def test_aclose_between_two_steps_ends_the_call_before_it_returns(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    async with client.stream(REQ) as stream:
        assert await anext(stream) == Content("Paris")
        started = time.monotonic()
        await client.aclose()
        assert time.monotonic() - started < WITHIN_S
        assert ended(server, client._gate.held)
        with pytest.raises(ClientClosed):
            await anext(stream)


@pytest.mark.asyncio
async def test_a_step_taken_while_the_end_runs_awaits_it_then_raises(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    token = CancelToken()
    stream = client.stream(REQ, cancel=token)
    assert await anext(stream) == Content("Paris")
    token.cancel()
    await asyncio.sleep(0)  # the end has begun in a task of its own
    with pytest.raises(Cancelled):
        await anext(stream)
    assert ended(server, client._gate.held), "ended by the time the step raised"
    await client.aclose()


@pytest.mark.asyncio
async def test_async_chat_whose_on_event_cancels_its_token_raises_cancelled(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    token = CancelToken()
    with pytest.raises(Cancelled):
        await client.chat(REQ, lambda event: token.cancel(), cancel=token)
    assert ended(server, client._gate.held)
    await client.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("reader", "second"),
    [("loop", "next"), ("loop", "run"), ("loop", "loop"), ("bare", "run"), ("bare", "loop")],
    ids=["loop-then-next", "loop-then-run", "loop-then-loop", "bare-steps-then-run", "bare-steps-then-loop"],
)
async def test_a_second_task_stepping_a_stream_being_read_is_refused(
    server: FakeServer, reader: str, second: str
) -> None:
    server.route(*CHAT, SLOW, sse_reply(ANSWER))
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    first = asyncio.Event()
    seen: list[ChatEvent] = []
    async with client.stream(REQ) as stream:

        async def read() -> None:
            if reader == "loop":
                async for event in stream:
                    seen.append(event)
                    first.set()
                return
            while True:  # bare steps: no loop object counted
                try:
                    seen.append(await stream.__anext__())
                except StopAsyncIteration:
                    return
                first.set()

        task = asyncio.ensure_future(read())
        await first.wait()
        await until_async(lambda: stream._steps.ag_running, 1.0)  # type: ignore[union-attr]  # the reader's next step
        with pytest.raises(RuntimeError, match=ONE_READER):
            if second == "next":
                await anext(stream)
            elif second == "loop":
                await anext(aiter(stream))
            else:
                await stream.run(ignore)
        await asyncio.wait_for(task, 2.0)
    assert len(seen) == 10, "the first loop read on to the end"
    assert stream.completion.content == "".join(f" w{n}" for n in range(1, 11))
    assert await client.chat(REQ, ignore) == ANSWER_COMPLETION
    await client.aclose()


@pytest.mark.asyncio
async def test_a_second_loop_refused_and_dropped_leaves_a_third_refused_too(server: FakeServer) -> None:
    server.route(*CHAT, SLOW)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    async with client.stream(REQ) as stream:
        first_loop = aiter(stream)
        assert isinstance(await anext(first_loop), Content)
        second = aiter(stream)
        with pytest.raises(RuntimeError, match=ONE_READER):
            await anext(second)
        del second
        gc.collect()
        with pytest.raises(RuntimeError, match=ONE_READER):
            await anext(aiter(stream))
        rest = [event async for event in first_loop]
    assert len(rest) == 9
    await client.aclose()


# -- what a race or a drop must not do ----------------------------------------------------------------


def test_a_cancel_in_the_main_thread_holding_the_clients_lock_never_deadlocks(server: FakeServer) -> None:
    # As a signal handler's cancel, in the main thread, cut into a call of the same client that
    # holds its registry's lock, while another thread reads: the end is left to the reader's
    # next step, which takes the lock once it is free.
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).client()
    token = CancelToken()
    stream = client.stream(REQ, cancel=token)
    taken, go_on = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def read() -> None:
        events = iter(stream)
        next(events)
        taken.set()
        go_on.wait(2.0)  # its own code, between two steps
        try:
            next(events)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    assert taken.wait(2.0)
    assert threading.current_thread() is threading.main_thread()
    with client._calls._lock:
        token.cancel()  # returns at once
    assert recorded(server, STOP) == []
    go_on.set()
    reader.join(2.0)
    assert [type(error) for error in outcome] == [Cancelled]
    until(lambda: ended(server, client._gate.held), WITHIN_S)
    client.close()


def test_a_second_loop_refused_leaves_the_first_reading_to_the_end(server: FakeServer) -> None:
    server.route(*CHAT, SLOW)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).client()
    stream = client.stream(REQ)
    first = iter(stream)
    assert next(first) == Content(" w1")  # the first loop, between two steps

    def second() -> None:
        for _event in stream:
            pass

    with pytest.raises(RuntimeError, match=ONE_READER):
        second()
    assert [event for event in first] == [Content(f" w{n}") for n in range(2, 11)]
    assert stream.completion.content == "".join(f" w{n}" for n in range(1, 11))
    assert recorded(server, STOP) == []
    client.close()


def test_a_stream_dropped_unclosed_is_collected_and_its_call_ended(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).client()
    stream = client.stream(REQ)
    assert next(stream) == Content("Paris")
    del stream
    gc.collect()
    until(lambda: ended(server, client._gate.held), WITHIN_S)
    client.close()


def test_a_step_after_a_close_from_another_thread_raises_cancelled(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).client()
    stream = client.stream(REQ)
    assert next(stream) == Content("Paris")  # read step by step, with no loop
    closer = threading.Thread(target=stream.close)
    closer.start()
    closer.join(1.0)
    with pytest.raises(Cancelled, match=CLOSED_WHILE_READ):
        next(stream)
    client.close()


def test_leaving_the_with_block_waits_for_an_end_a_cancel_began_elsewhere(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    server.route(*STOP, Reply(204, head_delay_s=0.1))  # a slow stop: the end takes 100 ms
    client = Container(config=config_for(server.socket_path, liveness_ms=5000, busy_wait_ms=50)).client()
    token = CancelToken()
    with client.stream(REQ, cancel=token) as stream:
        events = iter(stream)
        assert next(events) == Content("Paris")
        threading.Thread(target=token.cancel).start()
        until(lambda: len(recorded(server, STOP)) == 1, WITHIN_S)  # the end is under way
    assert not client._gate.held(0), "the with block was left once the call had ended"
    client.close()


@pytest.mark.asyncio
async def test_an_async_stream_dropped_unclosed_is_collected_and_its_call_ended(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    stream = client.stream(REQ)
    assert await anext(stream) == Content("Paris")
    del stream
    gc.collect()
    await until_async(lambda: ended(server, client._gate.held), WITHIN_S)
    await client.aclose()


@pytest.mark.asyncio
async def test_an_async_step_after_an_aclose_from_another_task_raises_cancelled(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    stream = client.stream(REQ)
    assert await anext(stream) == Content("Paris")
    await asyncio.create_task(stream.aclose())
    with pytest.raises(Cancelled, match=CLOSED_WHILE_READ):
        await anext(stream)
    await client.aclose()


@pytest.mark.asyncio
async def test_leaving_the_async_with_block_waits_for_an_end_another_task_began(server: FakeServer) -> None:
    server.route(*CHAT, HELD)
    server.route(*STOP, Reply(204, head_delay_s=0.1))
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    async with client.stream(REQ) as stream:
        assert await anext(stream) == Content("Paris")
        closer = asyncio.create_task(stream.aclose())
        await until_async(lambda: len(recorded(server, STOP)) == 1, WITHIN_S)  # the end is under way
    assert not client._gate.held(0), "the async with block was left once the call had ended"
    await closer
    await client.aclose()


@pytest.mark.asyncio
async def test_a_second_async_loop_refused_leaves_the_first_reading_to_the_end(server: FakeServer) -> None:
    server.route(*CHAT, SLOW)
    client = Container(config=config_for(server.socket_path, liveness_ms=5000)).async_client()
    stream = client.stream(REQ)
    first = aiter(stream)
    assert await anext(first) == Content(" w1")
    with pytest.raises(RuntimeError, match=ONE_READER):
        async for _event in stream:
            pass
    gc.collect()  # the refused loop, collected, ends nothing
    assert [event async for event in first] == [Content(f" w{n}") for n in range(2, 11)]
    assert stream.completion.content == "".join(f" w{n}" for n in range(1, 11))
    await client.aclose()


def many_slots(server: FakeServer, slots: int) -> Client:
    config = parse_config(
        {
            "socket": server.socket_path,
            "limits": {**LIMITS, "liveness_ms": 5000},
            "retry": RETRY,
            "expect": {**EXPECT, "total_slots": slots},
            "proxy": NO_PROXY_LIMIT,
        }
    )
    return Container(config=config).client()


@pytest.mark.parametrize("parked", [2, 12])
def test_a_close_from_a_worker_ending_streams_between_steps_returns_within_its_wait_however_stops_hang(
    server: FakeServer, parked: int
) -> None:
    # The blocking flavour ends them one after another in the closing thread: their stops share
    # one `STOP_WAIT_S`, each still written (a server that never answers one holds none up).
    server.route(*CHAT, HELD)
    server.route(*STOP, silence())
    client = many_slots(server, parked)
    readers = [iter(client.stream(ChatRequest(slot=slot, messages=REQ.messages))) for slot in range(parked)]
    for reader in readers:
        assert isinstance(next(reader), Content)  # now between two steps, in its own code
    took: list[float] = []

    def close() -> None:
        started = time.monotonic()
        client.close()
        took.append(time.monotonic() - started)

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(5.0)

    assert took and took[0] < CLOSE_WAIT_S + 0.05, f"close took {took[0] * 1000:.0f} ms"
    until(lambda: len(recorded(server, STOP)) == parked, 1.0)  # every stop written (the server reads them as it can)
    for reader in readers:
        with pytest.raises(ClientClosed):
            next(reader)


def test_a_close_wakes_the_calls_inside_a_step_before_it_ends_those_between_steps(server: FakeServer) -> None:
    # Two streams between steps, registered first, and two calls waiting inside a read: the
    # waiting ones are woken at once (their own stops run meanwhile), and every call has ended
    # when close() returns.
    server.route(*CHAT, HELD)
    server.route(*STOP, silence())
    client = many_slots(server, 4)
    readers = [iter(client.stream(ChatRequest(slot=slot, messages=REQ.messages))) for slot in (0, 1)]
    for reader in readers:
        assert isinstance(next(reader), Content)
    ended: list[float] = []
    first: list[threading.Event] = [threading.Event(), threading.Event()]

    def waiting(slot: int) -> None:
        with contextlib.suppress(ClientClosed):
            client.chat(ChatRequest(slot=slot, messages=REQ.messages), lambda event: first[slot - 2].set())
        ended.append(time.monotonic())

    inside = [threading.Thread(target=waiting, args=(slot,)) for slot in (2, 3)]
    for thread in inside:
        thread.start()
    assert all(event.wait(2.0) for event in first)
    closer = threading.Thread(target=client.close)
    started = time.monotonic()
    closer.start()
    closer.join(5.0)
    returned = time.monotonic()
    for thread in inside:
        thread.join(2.0)

    assert returned - started < CLOSE_WAIT_S + 0.05
    assert len(ended) == 2 and max(ended) <= returned + 0.005, "the waiting calls ended by close()'s return"
    until(lambda: len(recorded(server, STOP)) == 4, 1.0)
