"""A chat connects before it renders its body (`AsyncServerInfo.link_ahead`), so the proxy's
accept runs meanwhile; the connection is the one its request goes on, and it never outlives the
call: a body that cannot be rendered closes it, a wait at the slot gate does not hold it, and a
client that must ask `/props` for the slot count first makes none. Closing the client closes the
socket its transport made ahead for the next connect."""

from __future__ import annotations

import threading

import pytest

from adapters.fake_server import FakeServer, RecordedRequest, Script, json_reply, sse_reply
from adapters.proxy.testing import eventually
from app.container import Container
from client_support import ANSWER, ANSWER_COMPLETION, CHAT, REQ, Kind, config_for, recorded
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


def test_a_body_that_cannot_be_rendered_closes_its_connection(server: FakeServer, client_kind: Kind) -> None:
    client = client_kind.client_for(server)
    bad = ChatRequest(slot=REQ.slot, messages=REQ.messages, tool_choice="sometimes")
    with pytest.raises(RequestError, match="tool_choice"):
        client.chat(bad, lambda _e: None)
    assert eventually(lambda: server.accepted == 1)  # made ahead, as for any chat
    assert eventually(lambda: server.live == 0)  # and closed by the call, nothing sent on it
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
            # The second call's connection made ahead reached the server and was closed there.
            assert eventually(lambda: server.accepted == 2 and server.live == 1)
            live_while_queued.append(server.live)
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
