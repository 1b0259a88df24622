"""A chat that will send its request at once connects as soon as its body is rendered
(`AsyncServerInfo.link_ahead`), so the proxy's accept runs while the call sets out; the
connection is the one its request goes on. Nothing connects for a request that is refused, and
none is made ahead when it would wait or be spent for nothing: a slot busy at the gate, a
prediction to ask first, a slot count to ask `/props` for. Closing the client closes the socket
its transport made ahead for the next connect."""

from __future__ import annotations

import threading

import pytest

from adapters.fake_server import FakeServer, RecordedRequest, Script, json_reply, sse_reply
from app.config import parse_config
from app.container import Container
from client_support import ANSWER, ANSWER_COMPLETION, CHAT, EXPECT, LIMITS, REQ, RETRY, Kind, config_for, recorded
from domain.errors import RequestError
from domain.events import ChatEvent, Queued
from domain.messages import ChatRequest

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]


def test_a_chat_sends_on_the_one_connection_it_made_before_rendering(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)
    assert client.chat(REQ, lambda _e: None) == ANSWER_COMPLETION
    assert server.accepted == 1
    assert len(recorded(server, CHAT)) == 1


@pytest.mark.parametrize(
    "bad",
    [
        ChatRequest(slot=REQ.slot, messages=REQ.messages, tool_choice="sometimes"),  # type: ignore[arg-type]
        ChatRequest(slot=REQ.slot, messages=REQ.messages, max_tokens=-1),
        ChatRequest(slot=99, messages=REQ.messages),
    ],
    ids=["tool_choice", "max_tokens", "slot"],
)
def test_a_refused_request_connects_nothing(server: FakeServer, client_kind: Kind, bad: ChatRequest) -> None:
    client = client_kind.client_for(server)
    for call in (client.chat, client.chat_with_retry):
        with pytest.raises(RequestError):
            call(bad, lambda _e: None)
    assert server.accepted == 0, "not even a connection: the proxy's accept bucket counts each"
    assert server.requests == []


def test_a_chat_queued_at_the_gate_holds_no_connection_while_it_waits(server: FakeServer, client_kind: Kind) -> None:
    first_in = threading.Event()
    release = threading.Event()

    def held(request: RecordedRequest) -> Script:
        first_in.set()
        assert release.wait(5.0)
        return sse_reply(ANSWER)

    server.route(*CHAT, held, sse_reply(ANSWER))
    client = client_kind.client_for(server, poll_ms=200)
    live_while_queued: list[int] = []

    def second_event(event: ChatEvent) -> None:
        if isinstance(event, Queued) and not live_while_queued:
            # The slot was busy here: the second call made no connection ahead to drop.
            live_while_queued.append(server.accepted)
            release.set()

    outcome: list[object] = []
    first = threading.Thread(target=lambda: outcome.append(client.chat(REQ, lambda _e: None)))
    first.start()
    try:
        assert first_in.wait(5.0)
        assert client.chat(REQ, second_event) == ANSWER_COMPLETION
    finally:
        release.set()
        first.join(5.0)
    assert outcome == [ANSWER_COMPLETION]
    assert live_while_queued == [1]
    assert len(recorded(server, CHAT)) == 2
    assert server.accepted == 2, "one connection per request, none made ahead for nothing"


def test_a_predicted_turn_holds_no_connection_open_while_its_prediction_asks(
    server: FakeServer, client_kind: Kind
) -> None:
    live_while_predicting: list[int] = []

    def rendered(request: RecordedRequest) -> Script:
        live_while_predicting.append(server.live)  # this request's own connection, and no other
        return json_reply({"prompt": "<|user|>What is the capital of France?"})

    server.route("POST", "/apply-template", rendered)
    server.route(*CHAT, sse_reply(ANSWER))
    data = {
        "socket": server.socket_path,
        "limits": LIMITS,
        "retry": RETRY,
        "expect": EXPECT,
        "cache": {"predict": True},
    }
    client = client_kind.client_of(Container(config=parse_config(data)))

    assert client.chat(REQ, lambda _e: None) == ANSWER_COMPLETION

    assert live_while_predicting == [1]
    assert server.accepted == len(server.requests), "each connection carried a request"


def test_a_client_that_asks_props_for_the_slot_count_connects_for_the_chat_after_it(
    server: FakeServer, client_kind: Kind
) -> None:
    props = {"chat_template": "t", "total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    server.route("GET", "/props", json_reply(props))
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server, expect=False)
    assert client.chat(REQ, lambda _e: None) == ANSWER_COMPLETION
    first, second = server.requests
    assert (first.method, first.path, second.method, second.path) == ("GET", "/props", *CHAT)
    assert server.accepted == 2  # one each: none was made ahead to wait through /props


def test_closing_the_client_closes_the_socket_its_transport_made_ahead(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    container = Container(config=config_for(server.socket_path))
    client = client_kind.client_of(container)
    transport = container.async_transport() if client_kind.is_async else container.transport()
    client.chat(REQ, lambda _e: None)
    [(_, waiting)] = transport._ahead._ready  # made once the request was written, for the next connect
    client.close()
    assert waiting.fileno() == -1
    assert transport._ahead._ready == []
