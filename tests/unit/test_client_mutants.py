"""The client's iterator forms, its `close()`, and the words of a tokenize refusal, on the in-memory
fakes (a `FakeClock`, a `ScriptedTransport`, a `FakeSlotProbe`)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from adapters.fake_server import (
    FakeClock,
    FakeSlotProbe,
    Reply,
    ScriptedTransport,
    error_reply,
    json_reply,
    sse_reply,
)
from adapters.fake_server.script import JSON_HEADERS, Piece, RouteSpec
from app.client import Client
from app.config import parse_config
from client_support import CHAT, CONTROL, EXPECT, PROPS, overridden
from client_support import chunk as stream_chunk
from domain.cache import cache_outcome
from domain.cancel import CancelToken
from domain.completion import FinishReason, Timings
from domain.errors import Cancelled, ClientClosed, HttpError, RequestError, Stalled, ThinkingOverrun
from domain.events import ChatEvent, Content, Queued, Retrying
from domain.messages import ChatRequest, UserMessage
from ports import SlotState

pytestmark = pytest.mark.timeout(10)

JOIN_S = 5.0
CID = "chatcmpl-mutants"
REQ = ChatRequest(slot=1, messages=(UserMessage("hello"),))
chunk = partial(stream_chunk, cid=CID, cache_n=3, prompt_n=39)
ANSWER = [chunk({"content": "Hi"}, n=1), chunk({"content": "!"}, n=2), chunk(finish="stop", n=2)]


class ZeroJitter:
    def uniform(self, a: float, b: float) -> float:
        return 0.0


@pytest.fixture
def client_for() -> Iterator[Callable[..., tuple[Client, ScriptedTransport]]]:
    def build(routes: dict[tuple[str, str], RouteSpec], **sections: Any) -> tuple[Client, ScriptedTransport]:
        config = parse_config({"socket": "/fake/llama.sock", "expect": EXPECT, **sections})
        clock = FakeClock()
        transport = ScriptedTransport(clock, routes)
        probe = FakeSlotProbe({REQ.slot: SlotState.IDLE})
        container = make(config, clock=clock, transport=transport, probe=probe, rng=ZeroJitter())
        return container.client(), transport

    with overridden() as make:
        yield build


def test_stream_yields_the_events_then_holds_the_completion(client_for: Callable[..., Any]) -> None:
    client, _ = client_for({CHAT: sse_reply(ANSWER)})
    with client.stream(REQ) as stream:
        events = list(stream)
    assert events == [Content("Hi"), Content("!")]
    assert stream.completion.content == "Hi!"
    assert stream.completion.finish_reason is FinishReason.STOP


def test_stream_makes_one_attempt_and_stream_with_retry_retries(client_for: Callable[..., Any]) -> None:
    client, transport = client_for({CHAT: [error_reply(503, "Loading model"), sse_reply(ANSWER)]})
    with pytest.raises(HttpError) as caught, client.stream(REQ) as stream:
        list(stream)
    assert caught.value.status == 503
    assert len(transport.requests) == 1

    client, transport = client_for({CHAT: [error_reply(503, "Loading model"), sse_reply(ANSWER)]})
    with client.stream_with_retry(REQ) as stream:
        events = list(stream)
    assert [type(e) for e in events] == [Retrying, Content, Content]
    assert stream.completion.content == "Hi!"
    assert len(transport.requests) == 2


@pytest.mark.parametrize("retry", [False, True])
def test_a_stream_with_a_cancelled_token_sends_nothing(client_for: Callable[..., Any], retry: bool) -> None:
    client, transport = client_for({CHAT: sse_reply(ANSWER)})
    token = CancelToken()
    token.cancel()
    opened = client.stream_with_retry(REQ, token) if retry else client.stream(REQ, token)
    with pytest.raises(Cancelled), opened as stream:
        list(stream)
    assert transport.requests == []


def test_a_closed_client_refuses_a_new_call_without_touching_the_server(client_for: Callable[..., Any]) -> None:
    client, transport = client_for({CHAT: sse_reply(ANSWER)})
    client.close()
    client.close()  # idempotent
    with pytest.raises(ClientClosed) as caught:
        client.chat(REQ, lambda event: None)
    assert str(caught.value) == "the client is closed"
    assert transport.requests == []


def test_closing_the_client_during_a_call_ends_that_call(client_for: Callable[..., Any]) -> None:
    client, _ = client_for({CHAT: sse_reply(ANSWER, delay_s=0.01)})  # one read per chunk
    seen: list[ChatEvent] = []

    def close_on_first(event: ChatEvent) -> None:
        seen.append(event)
        if len(seen) == 1:
            client.close()  # from the call's own thread: it cannot end before close() returns

    with pytest.raises(ClientClosed) as caught:
        client.chat(REQ, close_on_first)
    assert str(caught.value) == "the client was closed while the call ran"
    assert seen == [Content("Hi")]


def test_tokenize_refuses_what_is_not_text_naming_its_type(client_for: Callable[..., Any]) -> None:
    client, transport = client_for({})
    with pytest.raises(RequestError) as caught:
        client.tokenize(b"hello")
    assert str(caught.value) == "tokenize takes text (a str), not bytes"
    assert transport.requests == []


def test_chat_with_retry_with_a_cancelled_token_sends_nothing_not_even_for_the_slot_count(
    client_for: Callable[..., Any],
) -> None:
    client, transport = client_for({CHAT: sse_reply(ANSWER)}, expect=None)  # the slot count comes from /props
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        client.chat_with_retry(REQ, lambda event: None, token)
    assert transport.requests == []


def test_a_retry_is_judged_by_the_milliseconds_spent_so_far(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # The first attempt takes 2000 ms; a wait of 999 ms then ends at 2999 ms, inside a 3000 ms budget.
    retry = {"attempts": 2, "delays_ms": [999], "jitter": 0.0, "total_ms": 3000}
    routes = {CHAT: [Reply(503, JSON_HEADERS, [Piece(0.0, b"{}")], head_delay_s=2.0), sse_reply(ANSWER)]}
    client, _ = client_for(routes, retry=retry)
    events: list[ChatEvent] = []
    with caplog.at_level(logging.WARNING, logger="inferpath.client"):
        completion = client.chat_with_retry(REQ, events.append)
    assert completion.content == "Hi!"
    assert events[0] == Retrying(attempt=2, after_ms=999, error="HttpError: HTTP 503: {}")
    assert [r.getMessage() for r in caplog.records] == [
        "slot 1: retrying as attempt 2 in 999 ms after HttpError: HTTP 503: {} "
        "(attempt 2 of 2; at most 999 ms of waits left)"
    ]


def test_a_cancel_during_the_retry_wait_ends_the_wait_at_once(client_for: Callable[..., Any]) -> None:
    retry = {"attempts": 2, "delays_ms": [60_000], "jitter": 0.0, "total_ms": 300_000}
    client, transport = client_for({CHAT: [error_reply(503, "Loading model"), sse_reply(ANSWER)]}, retry=retry)
    token = CancelToken()
    clock = transport.clock
    waited_from: list[float] = []

    def cancel_on_retrying(event: ChatEvent) -> None:
        if isinstance(event, Retrying):
            waited_from.append(clock.now())
            token.cancel()

    with pytest.raises(Cancelled):
        client.chat_with_retry(REQ, cancel_on_retrying, token)
    assert clock.now() == waited_from[0]  # the 60 s wait was not slept
    assert len(transport.requests) == 1


def test_each_answer_is_logged_with_its_counts_and_the_cache_outcome_against_the_one_before(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = client_for({CHAT: [sse_reply(ANSWER), sse_reply(ANSWER)]})
    with caplog.at_level(logging.DEBUG, logger="inferpath.client"):
        client.chat(REQ, lambda event: None)
        client.chat(REQ, lambda event: None)
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("slot 1: stop")]
    against = [r.getMessage() for r in caplog.records if "against the request before it" in r.getMessage()]
    assert done == ["slot 1: stop, 42 prompt tokens (3 cached), 2 predicted, 0 reasoning"] * 2
    timings = Timings(cache_n=3, prompt_n=39, predicted_n=2)
    assert against == [f"slot 1: against the request before it: {cache_outcome(timings, timings)}"]


def test_chat_with_a_cancelled_token_sends_nothing(client_for: Callable[..., Any]) -> None:
    client, transport = client_for({CHAT: sse_reply(ANSWER)})
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        client.chat(REQ, lambda event: None, token)
    assert transport.requests == []


def test_the_response_head_is_logged_with_its_status_and_wait(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = client_for({CHAT: sse_reply(ANSWER, head_delay_s=0.25)})
    with caplog.at_level(logging.DEBUG, logger="inferpath.client"):
        client.chat(REQ, lambda event: None)
    assert "slot 1: response head 200 after 250 ms" in [r.getMessage() for r in caplog.records]


def reasoning(n: int) -> dict[str, Any]:
    return chunk({"reasoning_content": "hm"}, n=n)


@pytest.mark.parametrize(
    ("answer", "logged"),
    [
        ({"success": True}, "reasoning_end posted: accepted"),
        ({"success": False}, "reasoning_end posted: the server answered {'success': False}"),
    ],
)
def test_the_reasoning_end_call_is_logged_with_the_servers_answer(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture, answer: dict[str, Any], logged: str
) -> None:
    stream = [reasoning(1), reasoning(2), chunk({"content": "Hi"}, n=3), chunk(finish="stop", n=3)]
    client, _ = client_for({CHAT: sse_reply(stream), CONTROL: json_reply(answer)}, limits={"thinking_cap": 2})
    with caplog.at_level(logging.DEBUG, logger="inferpath.client"), contextlib.suppress(ThinkingOverrun):
        client.chat(REQ, lambda event: None)
    assert logged in [r.getMessage() for r in caplog.records]


def test_tokens_past_max_tokens_do_not_keep_a_silent_stream_alive(client_for: Callable[..., Any]) -> None:
    # max_tokens 4: after "a", counts 5, 6, 7 arrive 600 ms apart with no text; they are no progress,
    # so the silence reaches the 1000 ms liveness limit before the final chunk.
    stream = [chunk({"content": "a"}, n=1), chunk(n=5), chunk(n=6), chunk(n=7), chunk(finish="stop", n=7)]
    client, _ = client_for({CHAT: sse_reply(stream, delay_s=0.6)}, limits={"max_tokens": 4, "liveness_ms": 1000})
    with pytest.raises(Stalled):
        client.chat(REQ, lambda event: None)


def test_an_error_body_is_read_until_the_liveness_limit_after_the_head(client_for: Callable[..., Any]) -> None:
    # The second piece comes 999.5 ms after the head, inside the 1000 ms the body may take.
    reply = Reply(500, JSON_HEADERS, [Piece(0.0, b"first "), Piece(0.9995, b"second")])
    client, _ = client_for({CHAT: reply}, limits={"liveness_ms": 1000})
    with pytest.raises(HttpError) as caught:
        client.chat(REQ, lambda event: None)
    assert caught.value.body == "first second"


def test_an_error_body_is_kept_up_to_the_configured_limit_even_past_4_kib(client_for: Callable[..., Any]) -> None:
    body = b"x" * 6000
    client, _ = client_for({CHAT: Reply(500, JSON_HEADERS, [Piece(0.0, body)])}, limits={"error_body_bytes": 8192})
    with pytest.raises(HttpError) as caught:
        client.chat(REQ, lambda event: None)
    assert caught.value.body == body.decode()


def test_a_call_cancelled_while_queued_leaves_the_queue_at_once(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = client_for({CHAT: [sse_reply(ANSWER), sse_reply(ANSWER)]})
    holding = threading.Event()
    release = threading.Event()

    def hold(event: ChatEvent) -> None:
        holding.set()
        release.wait(JOIN_S)

    holder = threading.Thread(target=client.chat, args=(REQ, hold))
    holder.start()
    try:
        assert holding.wait(JOIN_S)  # the holder has the slot and sits in its first event
        token = CancelToken()
        seen: list[ChatEvent] = []

        def cancel_when_queued(event: ChatEvent) -> None:
            seen.append(event)
            token.cancel()

        with caplog.at_level(logging.DEBUG, logger="inferpath.client"), pytest.raises(Cancelled):
            client.chat(REQ, cancel_when_queued, token)
        assert seen == [Queued(1)]
        assert "slot 1: queued, 1 ahead" in [r.getMessage() for r in caplog.records]
    finally:
        release.set()
        holder.join(JOIN_S)
    assert not holder.is_alive()


@pytest.mark.parametrize("retry", [False, True])
def test_a_call_cancelled_before_the_slot_count_is_known_asks_nothing_and_raises_the_cancels_error(
    client_for: Callable[..., Any], retry: bool
) -> None:
    client, transport = client_for({CHAT: sse_reply(ANSWER)}, expect=None)  # the slot count comes from /props
    token = CancelToken()
    token.cancel(Cancelled("the daemon is shutting down"))
    call = client.chat_with_retry if retry else client.chat
    with pytest.raises(Cancelled) as caught:
        call(REQ, lambda event: None, token)
    assert str(caught.value) == "the daemon is shutting down"
    assert transport.requests == []


def test_an_info_call_waits_load_wait_ms_for_the_head_and_the_liveness_limit_for_the_body(
    client_for: Callable[..., Any],
) -> None:
    props = {"chat_template": "t", "total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    # The head comes 179.9 s after the request (load_wait_ms 180 s), the body 29.99 s after the head
    # (liveness_ms 30 s): both just inside their limits.
    client, _ = client_for({PROPS: json_reply(props, head_delay_s=179.9, delay_s=29.99)})
    assert client.props().total_slots == 2
