"""The asyncio client against the fake server over a real Unix socket: the sync client's answers,
events, errors and bytes, its slot gate shared with the sync client, and asyncio's own
cancellation in every phase of a call.

Limits as in `client_support` (`TIMED`, 50-200 ms, where a test is about one). Cancellation
latency is measured from `task.cancel()` to the task's end; the brief's promise is 100 ms.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
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
    CONTROL,
    PROPS,
    REQ,
    SLOTS,
    chunk,
    config_for,
    recorded,
)
from domain.cancel import CancelToken
from domain.errors import Busy, Cancelled, ClientClosed, ConnectError, HttpError, InferError, Stalled
from domain.events import ChatEvent, Content, Queued, Reasoning, Retrying, Waiting
from domain.messages import ChatRequest, UserMessage

pytestmark = [pytest.mark.timeout(10), pytest.mark.asyncio]

WITHIN_S = 0.1


def clients(server: FakeServer, **options: Any) -> tuple[Client, AsyncClient]:
    """The sync and the async client of one container (one slot gate)."""
    container = Container(config=config_for(server.socket_path, **options))
    return container.client(), container.async_client()


def async_client(server: FakeServer, **options: Any) -> AsyncClient:
    return clients(server, **options)[1]


async def until(condition: Callable[[], bool], within_s: float = 2.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.002)


# -- the same answers -------------------------------------------------------------------------------


async def test_a_full_answer_equals_the_sync_clients_completion_and_events(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    sync, aio = clients(server)
    sync_events: list[ChatEvent] = []
    async_events: list[ChatEvent] = []

    expected = sync.chat(REQ, sync_events.append)
    completion = await aio.chat(REQ, async_events.append)

    assert completion == expected == ANSWER_COMPLETION
    assert async_events == sync_events == ANSWER_EVENTS
    assert not aio._gate.held(0)


async def test_a_stream_iterates_the_events_then_has_the_completion(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    aio = async_client(server)

    async with aio.stream(REQ) as s:
        events = [event async for event in s]

    assert events == ANSWER_EVENTS
    assert s.completion == ANSWER_COMPLETION


async def test_the_same_request_sends_the_same_bytes_with_both_clients(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    sync, aio = clients(server)
    req = ChatRequest(slot=1, messages=(UserMessage("Zürich? ☃"),), thinking=True, max_tokens=77, stop=("\n\n",))

    sync.chat(req, lambda event: None)
    await aio.chat(req, lambda event: None)

    first, second = recorded(server, CHAT)

    def headers(request: RecordedRequest) -> list[tuple[str, str]]:
        return [(k, v) for k, v in request.headers if k != "x-conversation-id"]

    assert (second.method, second.target, headers(second), second.body) == (
        first.method,
        first.target,
        headers(first),
        first.body,
    )
    # The one header of its own: each request names a conversation of its own.
    conversations = {first.header("x-conversation-id"), second.header("x-conversation-id")}
    assert len(conversations) == 2 and None not in conversations
    assert await aio.render(req) == sync.render(req) == first.body


async def test_props_slots_and_tokenize_answer_as_the_sync_client_does(server: FakeServer) -> None:
    template = "{{ messages }}"
    server.route(
        *PROPS,
        json_reply({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2, "chat_template": template}),
    )
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]))
    server.route("POST", "/tokenize", json_reply({"tokens": [{"id": 7, "piece": "Hi"}, {"id": 8, "piece": "!"}]}))
    sync, aio = clients(server)

    assert await aio.props() == sync.props()
    assert await aio.slots() == sync.slots()
    assert await aio.tokenize("Hi!") == sync.tokenize("Hi!")
    targets = [(r.method, r.target, r.body) for r in server.requests]
    assert targets[0::2] == targets[1::2], "each info call sends the same request with both clients"


async def test_a_slot_count_learned_from_props_is_part_of_the_first_attempt(server: FakeServer) -> None:
    server.route(
        *PROPS, json_reply({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1, "chat_template": "t"})
    )
    aio = async_client(server, expect=False)

    with pytest.raises(InferError, match="slot"):
        await aio.chat(ChatRequest(slot=1, messages=(UserMessage("x"),)), lambda event: None)

    assert recorded(server, CHAT) == [], "a slot out of range is refused before anything is sent"


async def test_errors_are_the_sync_clients_errors(server: FakeServer, tmp_path: Any) -> None:
    server.route(*CHAT, json_reply({"error": {"code": 400, "message": "exceeds the available context size"}}, 400))
    aio = async_client(server)
    with pytest.raises(HttpError) as caught:
        await aio.chat(REQ, lambda event: None)
    assert caught.value.status == 400
    assert "exceeds the available context size" in caught.value.body

    gone = Container(config=config_for(str(tmp_path / "nobody.sock"))).async_client()
    with pytest.raises(ConnectError, match=r"nobody\.sock"):
        await gone.chat(REQ, lambda event: None)


async def test_chat_with_retry_retries_with_the_same_bytes(server: FakeServer) -> None:
    answers = iter([json_reply({"error": {"code": 503, "message": "Loading model"}}, 503), sse_reply(ANSWER)])
    server.route(*CHAT, lambda request: next(answers))
    aio = async_client(server)
    events: list[ChatEvent] = []

    completion = await aio.chat_with_retry(REQ, events.append)

    assert completion == ANSWER_COMPLETION
    assert [type(e) for e in events] == [Retrying, *(type(e) for e in ANSWER_EVENTS)]
    assert events[0] == Retrying(attempt=2, after_ms=50, error=events[0].error, resend=True)  # type: ignore[union-attr]
    first, second = recorded(server, CHAT)
    assert first.body == second.body


async def test_stream_with_retry_retries_like_chat_with_retry(server: FakeServer) -> None:
    answers = iter([json_reply({"error": {"code": 503, "message": "Loading model"}}, 503), sse_reply(ANSWER)])
    server.route(*CHAT, lambda request: next(answers))
    aio = async_client(server)

    async with aio.stream_with_retry(REQ) as s:
        events = [event async for event in s]

    assert [type(e) for e in events] == [Retrying, *(type(e) for e in ANSWER_EVENTS)]
    assert s.completion == ANSWER_COMPLETION


async def test_a_server_whose_events_carry_nothing_new_ends_in_stalled(server: FakeServer) -> None:
    # An event every 30 ms for 1.5 s, each an empty delta: like keep-alives, they move nothing.
    from adapters.fake_server import Piece, Reply, sse_event

    pieces = [Piece(0.0, sse_event(chunk({"content": "Paris"}, n=1)))]
    pieces += [Piece(0.03, sse_event(chunk({}))) for _ in range(50)]
    server.route(*CHAT, Reply(200, (("Content-Type", "text/event-stream"),), pieces, end=End.SILENCE, chunked=True))
    aio = async_client(server, timed=True)
    started = time.monotonic()

    with pytest.raises(Stalled, match="liveness limit 100 ms"):
        await aio.chat(REQ, lambda event: None)

    assert time.monotonic() - started < 0.6
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(2.0)


async def test_the_head_wait_polls_slots_and_emits_waiting(server: FakeServer) -> None:
    server.route(*CHAT, silence())
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True}]))
    aio = async_client(server, poll_ms=50, busy_wait_ms=150)
    events: list[ChatEvent] = []

    with pytest.raises(InferError, match="stayed busy"):
        await aio.chat(REQ, events.append)

    assert events and all(e == Waiting(slot_busy=True) for e in events)
    assert len(recorded(server, SLOTS)) == len(events)


async def test_the_thinking_cap_posts_reasoning_end_and_emits_thinking_capped(server: FakeServer) -> None:
    reasoning = [chunk({"reasoning_content": f" t{n}"}, n=n) for n in range(1, 12)]
    server.route(*CHAT, sse_reply([*reasoning, chunk({"content": "ok"}, n=12), chunk(finish="stop", n=12)]))
    server.route(*CONTROL, json_reply({"success": True}))
    sync, aio = clients(server, thinking_cap=8, thinking_overrun=8)
    sync_events: list[ChatEvent] = []
    async_events: list[ChatEvent] = []

    expected = sync.chat(REQ, sync_events.append)
    completion = await aio.chat(REQ, async_events.append)

    assert completion == expected
    assert completion.thinking_capped
    assert async_events == sync_events
    first, second = recorded(server, CONTROL)
    assert first.body == second.body


# -- the shared slot gate ---------------------------------------------------------------------------


def _hold_slot_0(server: FakeServer) -> threading.Event:
    release = threading.Event()
    calls = iter(range(100))

    def reply(request: RecordedRequest) -> Script:
        if next(calls) == 0:
            release.wait(5.0)
        return sse_reply(ANSWER)

    server.route(*CHAT, reply)
    return release


async def test_a_sync_call_holding_slot_0_makes_an_async_call_queue(server: FakeServer) -> None:
    release = _hold_slot_0(server)
    sync, aio = clients(server)
    holder = threading.Thread(target=lambda: sync.chat(REQ, lambda event: None))
    holder.start()
    await until(lambda: aio._gate.held(0))
    events: list[ChatEvent] = []

    task = asyncio.create_task(aio.chat(REQ, events.append))
    await until(lambda: events == [Queued(1)])
    await until(lambda: len(recorded(server, CHAT)) == 1)
    await asyncio.sleep(0.05)
    assert len(recorded(server, CHAT)) == 1, "the queued call has sent nothing"
    release.set()
    completion = await task
    holder.join(5.0)

    assert completion == ANSWER_COMPLETION
    assert events == [Queued(1), *ANSWER_EVENTS]
    assert not aio._gate.held(0)


async def test_an_async_call_holding_slot_0_makes_a_sync_call_queue(server: FakeServer) -> None:
    release = _hold_slot_0(server)
    sync, aio = clients(server)
    task = asyncio.create_task(aio.chat(REQ, lambda event: None))
    await until(lambda: aio._gate.held(0))
    events: list[ChatEvent] = []
    outcome: list[Any] = []
    queued = threading.Thread(target=lambda: outcome.append(sync.chat(REQ, events.append)))
    queued.start()
    await until(lambda: events == [Queued(1)])
    await until(lambda: len(recorded(server, CHAT)) == 1)
    release.set()
    assert await task == ANSWER_COMPLETION
    await until(lambda: bool(outcome))
    queued.join(5.0)

    assert outcome == [ANSWER_COMPLETION]
    assert events == [Queued(1), *ANSWER_EVENTS]


async def test_async_calls_queue_in_order_and_a_full_queue_is_busy(server: FakeServer) -> None:
    release = _hold_slot_0(server)
    container = Container(config=config_for(server.socket_path, queue_per_slot=2, liveness_ms=2000, poll_ms=2000))
    aio = container.async_client()
    first = asyncio.create_task(aio.chat(REQ, lambda event: None))
    await until(lambda: aio._gate.held(0))
    seen: list[list[ChatEvent]] = [[], []]
    second = asyncio.create_task(aio.chat(REQ, seen[0].append))
    await until(lambda: seen[0] == [Queued(1)])
    third = asyncio.create_task(aio.chat(REQ, seen[1].append))
    await until(lambda: seen[1] == [Queued(2)])

    with pytest.raises(Busy):
        await aio.chat(REQ, lambda event: None)
    release.set()
    results = await asyncio.gather(first, second, third)

    assert results == [ANSWER_COMPLETION] * 3
    places = [e.ahead for e in seen[1] if isinstance(e, Queued)]
    assert places[0] == 2 and places == sorted(set(places), reverse=True), "the third only moves up"


# -- cancellation: asyncio's own --------------------------------------------------------------------


async def cancel_when(
    call: Awaitable[Any], ready: Callable[[], bool], *, settle_s: float = 0.02
) -> tuple[float, BaseException | None]:
    """Run `call` as a task, cancel it once `ready()` holds; seconds from `cancel()` to its end,
    and what it raised."""
    task = asyncio.ensure_future(call)
    await until(ready)
    await asyncio.sleep(settle_s)  # let the call go back to waiting
    cancelled_at = time.monotonic()
    task.cancel()
    try:
        await task
    except BaseException as exc:
        return time.monotonic() - cancelled_at, exc
    return time.monotonic() - cancelled_at, None


LATENCIES: dict[str, float] = {}


async def test_cancel_while_streaming_ends_at_once_and_closes_the_stream(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    aio = async_client(server, liveness_ms=2000)
    events: list[ChatEvent] = []

    latency, raised = await cancel_when(aio.chat(REQ, events.append), lambda: Content("Paris") in events)

    LATENCIES["streaming"] = latency
    assert isinstance(raised, asyncio.CancelledError)
    assert latency < WITHIN_S
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0), "closing the connection is what stops the generation"
    assert not aio._gate.held(0)


async def test_cancel_while_waiting_for_the_head_ends_at_once(server: FakeServer) -> None:
    server.route(*CHAT, silence())
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True}]))
    aio = async_client(server, poll_ms=50, busy_wait_ms=2000)
    events: list[ChatEvent] = []

    latency, raised = await cancel_when(aio.chat(REQ, events.append), lambda: bool(events))

    LATENCIES["head"] = latency
    assert isinstance(raised, asyncio.CancelledError)
    assert latency < WITHIN_S
    assert all(r.client_closed.wait(1.0) for r in server.requests)
    assert not aio._gate.held(0)


async def test_cancel_during_a_slots_poll_ends_at_once_and_closes_the_poll(server: FakeServer) -> None:
    polled = threading.Event()

    def slots(request: RecordedRequest) -> Script:
        polled.set()
        return silence()

    server.route(*CHAT, silence())
    server.route(*SLOTS, slots)
    aio = async_client(server, poll_ms=50, busy_wait_ms=2000, load_wait_ms=2000)

    latency, raised = await cancel_when(aio.chat(REQ, lambda event: None), polled.is_set)

    LATENCIES["slots poll"] = latency
    assert isinstance(raised, asyncio.CancelledError)
    assert latency < WITHIN_S
    polls = recorded(server, SLOTS)
    assert polls, "the cancel came during a poll"
    assert all(poll.client_closed.wait(1.0) for poll in polls), "every poll is closed"
    assert recorded(server, CHAT)[0].client_closed.wait(1.0)


async def test_cancel_while_queued_gives_up_the_place_and_sends_nothing(server: FakeServer) -> None:
    release = _hold_slot_0(server)
    aio = async_client(server, liveness_ms=2000, poll_ms=2000)
    holder = asyncio.create_task(aio.chat(REQ, lambda event: None))
    await until(lambda: aio._gate.held(0))
    events: list[ChatEvent] = []

    latency, raised = await cancel_when(aio.chat(REQ, events.append), lambda: bool(events))
    release.set()
    await holder

    LATENCIES["queued"] = latency
    assert isinstance(raised, asyncio.CancelledError)
    assert latency < WITHIN_S
    assert events == [Queued(1)]
    assert len(recorded(server, CHAT)) == 1, "the cancelled request was never sent"
    assert aio._gate.waiting(0) == 0


async def test_cancel_while_posting_reasoning_end_ends_at_once(server: FakeServer) -> None:
    reasoning = [chunk({"reasoning_content": f" t{n}"}, n=n) for n in range(1, 12)]
    server.route(*CHAT, sse_reply(reasoning, done=False, end=End.SILENCE))
    posted = threading.Event()

    def control(request: RecordedRequest) -> Script:
        posted.set()
        return silence()

    server.route(*CONTROL, control)
    aio = async_client(server, thinking_cap=8, thinking_overrun=4, liveness_ms=2000)

    latency, raised = await cancel_when(aio.chat(REQ, lambda event: None), posted.is_set)

    LATENCIES["control call"] = latency
    assert isinstance(raised, asyncio.CancelledError)
    assert latency < WITHIN_S
    (control_call,) = recorded(server, CONTROL)
    assert control_call.client_closed.wait(1.0)
    assert recorded(server, CHAT)[0].client_closed.wait(1.0)


async def test_cancel_while_waiting_to_retry_makes_no_later_attempt(server: FakeServer) -> None:
    server.route(*CHAT, json_reply({"error": {"code": 503, "message": "Loading model"}}, 503))
    aio = async_client(server, retry={"attempts": 2, "delays_ms": [2000], "total_ms": 5000})
    events: list[ChatEvent] = []

    latency, raised = await cancel_when(aio.chat_with_retry(REQ, events.append), lambda: bool(events))

    LATENCIES["retry wait"] = latency
    assert isinstance(raised, asyncio.CancelledError)
    assert latency < WITHIN_S
    assert len(recorded(server, CHAT)) == 1
    assert not aio._gate.held(0)


async def test_cancelling_a_task_iterating_a_stream_closes_the_connection(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    aio = async_client(server, liveness_ms=2000)
    seen: list[ChatEvent] = []

    async def consume() -> None:
        async with aio.stream(REQ) as s:
            async for event in s:
                seen.append(event)

    latency, raised = await cancel_when(consume(), lambda: bool(seen))

    assert isinstance(raised, asyncio.CancelledError)
    assert latency < WITHIN_S
    assert recorded(server, CHAT)[0].client_closed.wait(1.0)
    assert not aio._gate.held(0)


async def test_cancelled_inside_a_timeout_the_caller_gets_timeout_error(server: FakeServer) -> None:
    # The call's own waits must not swallow a cancellation that belongs to the caller.
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    aio = async_client(server, liveness_ms=2000)

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.15):
            await aio.chat(REQ, lambda event: None)

    assert recorded(server, CHAT)[0].client_closed.wait(1.0)


# -- a CancelToken and aclose -----------------------------------------------------------------------


async def test_a_cancel_token_from_another_thread_raises_cancelled(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    aio = async_client(server, liveness_ms=2000)
    token = CancelToken()
    events: list[ChatEvent] = []
    task = asyncio.create_task(aio.chat(REQ, events.append, cancel=token))
    await until(lambda: bool(events))
    cancelled_at = time.monotonic()
    threading.Thread(target=token.cancel).start()

    with pytest.raises(Cancelled) as caught:
        await task

    assert time.monotonic() - cancelled_at < WITHIN_S
    assert type(caught.value) is Cancelled
    assert recorded(server, CHAT)[0].client_closed.wait(1.0)
    assert task.cancelling() == 0, "the task's own cancellation is taken back"


async def test_a_token_cancelled_before_the_call_sends_nothing(server: FakeServer) -> None:
    token = CancelToken()
    token.cancel()

    with pytest.raises(Cancelled):
        await async_client(server).chat(REQ, lambda event: None, cancel=token)
    await asyncio.sleep(0.05)  # a request on its way would be recorded by now

    assert server.requests == []


async def test_a_token_cancelled_while_the_consumer_runs_its_own_code_is_seen_at_the_next_step(
    server: FakeServer,
) -> None:
    server.route(*CHAT, sse_reply(ANSWER, delay_s=0.01))
    aio = async_client(server)
    token = CancelToken()
    other_work_done = False

    with pytest.raises(Cancelled):
        async with aio.stream(REQ, cancel=token) as s:
            async for _ in s:
                token.cancel()
                await asyncio.sleep(0.05)  # the consumer's own await is not interrupted
                other_work_done = True

    assert other_work_done
    assert recorded(server, CHAT)[0].client_closed.wait(1.0)


async def test_aclose_ends_calls_in_flight_and_queued_and_refuses_new_ones(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    aio = async_client(server, liveness_ms=2000, poll_ms=2000)
    streaming: list[ChatEvent] = []
    first = asyncio.create_task(aio.chat(REQ, streaming.append))
    await until(lambda: bool(streaming))
    queued: list[ChatEvent] = []
    second = asyncio.create_task(aio.chat(REQ, queued.append))
    await until(lambda: bool(queued))

    started = time.monotonic()
    await aio.aclose()
    closed_in = time.monotonic() - started
    outcomes = await asyncio.gather(first, second, return_exceptions=True)
    requests_before = len(server.requests)

    assert closed_in < 0.3
    assert all(isinstance(o, ClientClosed) for o in outcomes), outcomes
    with pytest.raises(ClientClosed):
        await aio.chat(REQ, lambda event: None)
    with pytest.raises(ClientClosed):
        await aio.chat_with_retry(REQ, lambda event: None)
    with pytest.raises(ClientClosed):
        async with aio.stream(REQ) as s:
            [event async for event in s]
    assert len(server.requests) == requests_before, "a closed client touches no server"
    assert recorded(server, CHAT)[0].client_closed.wait(1.0)
    assert not aio._gate.held(0)


async def test_a_client_used_as_an_async_context_manager_is_closed_after_it(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    async with async_client(server) as aio:
        assert await aio.chat(REQ, lambda event: None) == ANSWER_COMPLETION

    with pytest.raises(ClientClosed):
        await aio.chat(REQ, lambda event: None)


async def test_leaving_a_stream_early_closes_the_connection_at_once(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    aio = async_client(server, liveness_ms=2000)

    async with aio.stream(REQ) as s:
        async for event in s:
            assert event == Content("Paris")
            break
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0)
    assert not aio._gate.held(0)
    with pytest.raises(RuntimeError, match="no completion"):
        s.completion  # noqa: B018


async def test_a_stream_raises_the_calls_error_from_the_loop(server: FakeServer) -> None:
    server.route(*CHAT, sse_reply([chunk({"reasoning_content": "x"}, n=1)], done=False, end=End.SILENCE))
    aio = async_client(server, timed=True)
    seen: list[ChatEvent] = []

    with pytest.raises(Stalled, match="liveness limit"):
        async with aio.stream(REQ) as s:
            async for event in s:
                seen.append(event)

    # The stall is one re-attach (refused by this server: no replay), then the error.
    reasoning, retrying = seen
    assert reasoning == Reasoning("x")
    assert isinstance(retrying, Retrying) and (retrying.attempt, retrying.after_ms) == (2, 50)
    assert retrying.error.startswith("Stalled: no data for")
    assert len(recorded(server, ("GET", "/v1/stream"))) == 1
