"""`Client.stream` and `Client.stream_with_retry`, the iterator forms of a call, on the in-memory fakes (a
`FakeClock`, a `ScriptedTransport`, a `FakeSlotProbe`): the events and then the completion, one attempt
or a retry, and nothing sent for a token cancelled before the call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import error_reply, sse_reply
from client_support import CHAT
from domain.cancel import CancelToken
from domain.completion import FinishReason
from domain.errors import Cancelled, HttpError
from domain.events import Content, Retrying
from scripted_client import ANSWER, REQ

pytestmark = pytest.mark.timeout(10)


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
