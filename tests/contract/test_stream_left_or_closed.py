"""A stream's loop left early, and a stream closed while another thread or task reads it, in both
flavours: a `break` ends the call (its generation stopped with a `DELETE`, its slot given back)
and the stream yields nothing more; a close from elsewhere ends the reader's loop with
`Cancelled`, never as if the answer had come whole."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from adapters.fake_server import End, FakeServer, sse_reply
from app.container import Container
from app.event_stream import CLOSED_WHILE_READ, AsyncEventStream
from client_support import ANSWER, ANSWER_COMPLETION, CHAT, REQ, STOP, chunk, config_for, recorded
from domain.errors import Cancelled
from domain.events import ChatEvent, Content

pytestmark = pytest.mark.timeout(20)

# Twenty words 50 ms apart: a second of streaming, ended early by every test.
SLOW = sse_reply([chunk({"content": f" w{n}"}, n=n) for n in range(1, 21)], delay_s=0.05)


def ignore(event: ChatEvent) -> None:
    return None


def serving(server: FakeServer) -> None:
    server.route(*CHAT, SLOW, sse_reply(ANSWER))


def until(condition: object, within_s: float = 3.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.002)


async def until_async(condition: object, within_s: float = 3.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.002)


# -- the blocking flavour ---------------------------------------------------------------------------


def test_a_break_ends_the_call_at_once_and_the_stream_yields_nothing_more(server: FakeServer) -> None:
    serving(server)
    client = Container(config=config_for(server.socket_path)).client()
    with client.stream(REQ) as stream:
        for event in stream:
            assert isinstance(event, Content)
            break
        assert len(recorded(server, STOP)) == 1, "stopped at the break, inside the with"
        assert client._gate.waiting(0) == 0
        assert list(stream) == []
    with pytest.raises(RuntimeError, match="no completion"):
        _ = stream.completion
    assert client.chat(REQ, ignore) == ANSWER_COMPLETION, "the slot was given back"
    client.close()


@pytest.mark.parametrize("where", ["inside the call", "in its own code"])
def test_a_close_from_another_thread_ends_the_readers_loop_with_cancelled(server: FakeServer, where: str) -> None:
    serving(server)
    client = Container(config=config_for(server.socket_path)).client()
    stream = client.stream(REQ)
    first = threading.Event()
    closed = threading.Event()
    seen: list[ChatEvent] = []

    def close_it() -> None:
        assert first.wait(3.0)
        stream.close()
        closed.set()

    closer = threading.Thread(target=close_it)
    closer.start()
    with pytest.raises(Cancelled, match=CLOSED_WHILE_READ):
        for event in stream:
            seen.append(event)
            first.set()
            if where == "in its own code":
                assert closed.wait(3.0)  # the close lands between two events
    closer.join(3.0)
    assert 0 < len(seen) < 20
    until(lambda: len(recorded(server, STOP)) == 1)
    assert client.chat(REQ, ignore) == ANSWER_COMPLETION
    client.close()


# -- asyncio --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_async_break_ends_the_call_and_the_stream_yields_nothing_more(server: FakeServer) -> None:
    serving(server)
    client = Container(config=config_for(server.socket_path)).async_client()
    async with client.stream(REQ) as stream:
        async for event in stream:
            assert isinstance(event, Content)
            break
        await until_async(lambda: len(recorded(server, STOP)) == 1)  # on the loop's next turns
        assert [event async for event in stream] == []
    with pytest.raises(RuntimeError, match="no completion"):
        _ = stream.completion
    assert await client.chat(REQ, ignore) == ANSWER_COMPLETION, "the slot was given back"
    await client.aclose()


@pytest.mark.asyncio
async def test_an_async_break_without_with_gives_the_slot_back(server: FakeServer) -> None:
    serving(server)
    client = Container(config=config_for(server.socket_path, busy_wait_ms=150)).async_client()
    stream = client.stream(REQ)
    async for _event in stream:
        break
    # The next call on the slot is not held up by the one left: no WaitTimeout at the gate.
    assert await client.chat(REQ, ignore) == ANSWER_COMPLETION
    assert len(recorded(server, STOP)) == 1
    await client.aclose()


@pytest.mark.asyncio
async def test_leaving_the_with_block_after_a_break_waits_for_the_call_to_end(server: FakeServer) -> None:
    serving(server)
    client = Container(config=config_for(server.socket_path)).async_client()
    async with client.stream(REQ) as stream:
        async for _event in stream:
            break
    (stop,) = recorded(server, STOP)  # sent before the block was left
    assert stop.method == "DELETE"
    await client.aclose()


@pytest.mark.asyncio
async def test_an_aclose_from_another_task_ends_the_readers_loop_with_cancelled(server: FakeServer) -> None:
    serving(server)
    client = Container(config=config_for(server.socket_path)).async_client()
    stream = client.stream(REQ)
    first = asyncio.Event()
    seen: list[ChatEvent] = []

    async def read() -> None:
        async for event in stream:
            seen.append(event)
            first.set()

    reader = asyncio.ensure_future(read())
    await first.wait()
    await stream.aclose()
    with pytest.raises(Cancelled, match=CLOSED_WHILE_READ):
        await reader
    assert 0 < len(seen) < 20
    await until_async(lambda: len(recorded(server, STOP)) == 1)
    assert await client.chat(REQ, ignore) == ANSWER_COMPLETION
    await client.aclose()


@pytest.mark.asyncio
async def test_anext_of_a_fresh_loop_gives_the_first_event_then_ends_the_call_as_next_of_iter_does(
    server: FakeServer,
) -> None:
    serving(server)
    client = Container(config=config_for(server.socket_path)).async_client()
    stream = client.stream(REQ)

    first = await anext(aiter(stream))  # the loop is dropped before its step runs

    assert isinstance(first, Content), "the event is handed out, not lost"
    await until_async(lambda: len(recorded(server, STOP)) == 1)  # then the loop, left, ends the call
    assert await client.chat(REQ, ignore) == ANSWER_COMPLETION, "the slot was given back"
    await client.aclose()


@pytest.mark.asyncio
async def test_a_loop_dropped_before_it_asked_for_a_step_ends_nothing(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = Container(config=config_for(server.socket_path)).async_client()
    async with client.stream(REQ) as stream:
        first = await stream.__anext__()
        aiter(stream)  # made and dropped: as a generator never started
        events = [first] + [event async for event in stream]

    assert Content(".") in events
    assert stream.completion == ANSWER_COMPLETION
    assert recorded(server, STOP) == []
    await client.aclose()


def test_a_stream_read_on_after_the_loop_it_began_on_ended_is_an_error_not_a_clean_end(server: FakeServer) -> None:
    serving(server)
    client = Container(config=config_for(server.socket_path)).async_client()
    stream = client.stream(REQ)

    async def first() -> ChatEvent:
        return await stream.__anext__()

    async def rest() -> list[ChatEvent]:
        return [event async for event in stream]

    assert isinstance(asyncio.run(first()), Content)  # its loop's end closes the call
    with pytest.raises(RuntimeError, match="without a completion: the end of the event loop it began on closed it"):
        asyncio.run(rest())
    assert len(recorded(server, STOP)) == 1


def test_an_aclose_from_another_event_loop_ends_the_call_and_its_reader_raises(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    container = Container(config=config_for(server.socket_path, liveness_ms=5000))
    client = container.async_client()
    streams: list[AsyncEventStream] = []
    read_one, closed = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def read_on_loop_one() -> None:
        async def main() -> None:
            stream = client.stream(REQ)
            streams.append(stream)
            events = aiter(stream)
            await anext(events)
            read_one.set()
            while not closed.is_set():  # the consumer in its own code, between two steps
                await asyncio.sleep(0.005)
            try:
                await anext(events)
            except BaseException as exc:
                outcome.append(exc)

        asyncio.run(main())

    reader = threading.Thread(target=read_on_loop_one)
    reader.start()
    assert read_one.wait(2.0)
    asyncio.run(streams[0].aclose())  # on a loop of its own
    closed.set()
    reader.join(2.0)

    assert len(recorded(server, STOP)) == 1, "the generation was stopped"
    assert not container.gate().held(REQ.slot), "the slot is free"
    assert len(outcome) == 1 and isinstance(outcome[0], Cancelled)
