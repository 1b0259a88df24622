"""Arguments of the wrong kind are the caller's bug: a `RequestError` naming the argument,
before anything is sent, in both flavours (each test runs over both clients, `client_kind`)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from adapters.fake_server import FakeServer, json_reply, sse_reply
from client_support import ANSWER, ANSWER_COMPLETION, CHAT, PROPS, REQ, Kind
from domain.errors import RequestError
from domain.events import ChatEvent
from domain.messages import ChatRequest, UserMessage

pytestmark = pytest.mark.timeout(20)


def ignore(event: ChatEvent) -> None:
    return None


@pytest.mark.parametrize("bad", ["print", 42])
def test_an_on_event_that_cannot_be_called_is_refused_before_anything_is_sent(
    server: FakeServer, client_kind: Kind, bad: Any
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)
    for call in (client.chat, client.chat_with_retry):
        with pytest.raises(RequestError) as caught:
            call(REQ, bad)
        assert str(caught.value) == f"on_event must be callable, not {type(bad).__name__}"
    assert server.requests == []
    assert client.chat(REQ, ignore) == ANSWER_COMPLETION  # the client is none the worse
    client.close()


def test_a_call_without_on_event_returns_the_completion(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)

    assert client.chat(REQ) == ANSWER_COMPLETION
    assert client.chat_with_retry(REQ, None) == ANSWER_COMPLETION
    client.close()


@pytest.mark.parametrize("bad", ["x", 1, object()])
def test_a_cancel_that_is_not_a_token_is_refused_before_anything_is_sent(
    server: FakeServer, client_kind: Kind, bad: Any
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    server.route(*PROPS, json_reply({"total_slots": 2}))
    client = client_kind.client_for(server)
    calls = [
        lambda: client.chat(REQ, ignore, cancel=bad),
        lambda: client.chat_with_retry(REQ, ignore, cancel=bad),
        lambda: client.props(cancel=bad),
        lambda: client.render(REQ, cancel=bad),
    ]
    for call in calls:
        with pytest.raises(RequestError) as caught:
            call()
        assert str(caught.value) == f"cancel must be a CancelToken or None, not {type(bad).__name__}"
    assert server.requests == []
    assert client.chat(REQ, ignore) == ANSWER_COMPLETION
    client.close()


class _AsyncSink:
    async def __call__(self, event: object) -> None:
        return None


async def _async_generator_sink(event: object) -> AsyncIterator[object]:
    yield event


@pytest.mark.parametrize(
    "sink",
    [_AsyncSink(), functools.partial(_AsyncSink().__call__), _async_generator_sink],
    ids=["async-call-object", "partial-of-async", "async-generator"],
)
def test_an_async_on_event_is_a_request_error_before_anything_is_sent(
    server: FakeServer, client_kind: Kind, sink: object
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))

    with pytest.raises(RequestError, match="on_event must be a plain function"):
        client_kind.client_for(server).chat(REQ, sink)  # type: ignore[arg-type]
    assert server.requests == []


def test_an_on_event_that_returns_an_awaitable_ends_the_call_with_a_type_error(
    server: FakeServer, client_kind: Kind
) -> None:
    # Known only once it is called, after the request was sent: the callback's error, not a
    # RequestError (which says nothing was sent).
    server.route(*CHAT, sse_reply(ANSWER))
    made: list[Coroutine[Any, Any, None]] = []

    async def handle(event: object) -> None:
        return None

    def sink(event: object) -> Coroutine[Any, Any, None]:
        made.append(handle(event))
        return made[-1]

    with pytest.raises(TypeError, match=r"on_event must be a plain function.*it returned coroutine for Progress"):
        client_kind.client_for(server).chat(REQ, sink)
    assert [c.cr_frame for c in made] == [None], "the coroutine was closed, not left unawaited"


def test_with_the_slot_count_left_to_props_a_bad_request_is_refused_before_props_is_asked(
    server: FakeServer, client_kind: Kind
) -> None:
    # The server is loading: asking it first would end a bad request in its 503, retried.
    server.route(*PROPS, json_reply({"error": {"code": 503, "message": "Loading model"}}, 503))
    client = client_kind.client_for(server, expect=False)
    bad = ChatRequest(slot=0, messages=[UserMessage("x")], max_tokens=-5)

    with pytest.raises(RequestError, match="max_tokens"):
        client.chat_with_retry(bad, lambda event: None)
    with pytest.raises(RequestError, match="a request needs slot= or session="):
        client.render(ChatRequest(slot=None, messages=[UserMessage("x")]))
    with pytest.raises(RequestError, match="slot -1 is negative"):
        client.restore_slot(-1)
    assert server.requests == [], "nothing was asked of the server"


def test_an_on_event_that_returns_an_async_generator_ends_the_call_with_a_type_error(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))

    async def handle(event: object) -> AsyncIterator[object]:
        yield event

    with pytest.raises(TypeError, match="it returned async_generator for Progress"):
        client_kind.client_for(server).chat(REQ, lambda event: handle(event))
