"""What the client refuses, in so many words, on the in-memory fakes: a call once it is closed, the
call that `close()` cut short, and a tokenize of what is not text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import sse_reply
from client_support import CHAT
from domain.errors import ClientClosed, RequestError
from domain.events import ChatEvent, Content
from scripted_client import ANSWER, REQ

pytestmark = pytest.mark.timeout(10)


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
