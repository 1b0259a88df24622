"""A request's `prefill` through the client, over both clients against the fake server: the body
sent is the one of the same request ending in an assistant message with that text, and a prefill
the server would refuse is refused before anything is sent."""

from __future__ import annotations

from dataclasses import replace

import pytest

from adapters.fake_server import FakeServer, sse_reply
from client_support import ANSWER, ANSWER_COMPLETION, CHAT, REQ, Kind, recorded
from domain.errors import RequestError
from domain.messages import AssistantMessage

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

OPENING = "The capital of France is"


def test_a_prefilled_chat_sends_the_body_of_the_request_ending_in_the_assistant_message(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)
    by_hand = replace(REQ, messages=[*REQ.messages, AssistantMessage(OPENING)])

    assert client.chat(replace(REQ, prefill=OPENING)) == ANSWER_COMPLETION

    (sent,) = recorded(server, CHAT)
    assert sent.body == client.render(by_hand) == client.render(replace(REQ, prefill=OPENING))
    assert sent.json()["messages"][-1] == {"role": "assistant", "content": OPENING}


def test_a_prefill_the_server_would_refuse_is_refused_before_anything_is_sent(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)

    with pytest.raises(RequestError, match="prefill cannot be combined with thinking"):
        client.chat_with_retry(replace(REQ, prefill=OPENING, thinking=True))

    assert recorded(server, CHAT) == []
