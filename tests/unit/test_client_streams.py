"""`Client.stream` and `Client.stream_with_retry`, the iterator forms of a call, on the in-memory fakes (a
`FakeClock`, a `ScriptedTransport`, a `FakeSlotProbe`): the events and then the completion, one attempt
or a retry, and nothing sent for a token cancelled before the call."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from adapters.fake_server import FakeClock, FakeSlotProbe, ScriptedTransport, error_reply, sse_reply
from adapters.fake_server.script import RouteSpec
from app.client import Client
from app.config import parse_config
from client_support import CHAT, EXPECT, overridden
from client_support import chunk as stream_chunk
from domain.cancel import CancelToken
from domain.completion import FinishReason
from domain.errors import Cancelled, HttpError
from domain.events import Content, Retrying
from domain.messages import ChatRequest, UserMessage
from ports import SlotState

pytestmark = pytest.mark.timeout(10)

CID = "chatcmpl-client"
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
