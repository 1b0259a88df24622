"""What the client refuses, in so many words, on the in-memory fakes: a call once it is closed, the
call that `close()` cut short, and a tokenize of what is not text."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from adapters.fake_server import FakeClock, FakeSlotProbe, ScriptedTransport, sse_reply
from adapters.fake_server.script import RouteSpec
from app.client import Client
from app.config import parse_config
from client_support import CHAT, EXPECT, overridden
from client_support import chunk as stream_chunk
from domain.errors import ClientClosed, RequestError
from domain.events import ChatEvent, Content
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
