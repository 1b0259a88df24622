"""A cancelled call says how far its answer had come: `Cancelled` (and `ClientClosed`) carries the
text of the `Content` and `Reasoning` events the call handed out before it, since the call began
or its last re-send; empty when none came. Over both clients, for `chat`, `chat_with_retry` and
the stream, against the fake server over a real Unix socket."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import End, FakeServer, RecordedRequest, ReplayRing, Reply, sse_reply
from client_support import CHAT, REQ, STOP, Kind, chunk
from domain.cancel import CancelToken
from domain.errors import Cancelled, ClientClosed
from domain.events import ChatEvent, Content, Reasoning, Retrying
from domain.messages import ChatRequest, UserMessage

pytestmark = [pytest.mark.timeout(20), pytest.mark.usefixtures("client_kind")]

THOUGHT = [chunk({"reasoning_content": "The user "}, n=1), chunk({"reasoning_content": "asks."}, n=2)]
SAID = [chunk({"content": "Pa"}, n=3), chunk({"content": "ris"}, n=4), chunk({"content": " is"}, n=5)]


def then_silent(chunks: list[dict[str, Any]]) -> Reply:
    """The chunks, then nothing: the call waits inside its stream until it is ended."""
    return sse_reply(chunks, done=False, end=End.SILENCE)


def text(events: list[ChatEvent], kind: type[Content] | type[Reasoning]) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


def cancel_once(token: CancelToken, events: list[ChatEvent], count: int) -> Callable[[ChatEvent], None]:
    """An `on_event` that keeps every event and cancels once `count` `Content` events came."""

    def on_event(event: ChatEvent) -> None:
        events.append(event)
        if sum(isinstance(e, Content) for e in events) == count:
            token.cancel()

    return on_event


@pytest.mark.parametrize("retry", [False, True], ids=["chat", "chat_with_retry"])
def test_a_cancelled_chat_carries_the_text_and_reasoning_its_events_brought(
    server: FakeServer, client_kind: Kind, retry: bool
) -> None:
    server.route(*CHAT, then_silent([*THOUGHT, *SAID]))
    client = client_kind.client_for(server, liveness_ms=2000)
    token, events = CancelToken(), list[ChatEvent]()
    call = client.chat_with_retry if retry else client.chat

    with pytest.raises(Cancelled) as caught:
        call(REQ, cancel_once(token, events, 2), cancel=token)

    assert (caught.value.content, caught.value.reasoning) == ("Paris", "The user asks.")
    assert caught.value.content == text(events, Content) and caught.value.reasoning == text(events, Reasoning)


def test_a_cancelled_stream_carries_the_text_its_loop_was_handed(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, then_silent([*THOUGHT, *SAID]))
    client = client_kind.client_for(server, liveness_ms=2000)
    token = CancelToken()
    seen: list[ChatEvent] = []

    with client.stream(REQ, cancel=token) as stream, pytest.raises(Cancelled) as caught:
        for event in stream:
            seen.append(event)
            if isinstance(event, Content) and event.text == "ris":
                stop = threading.Thread(target=token.cancel)  # from elsewhere, as a Stop button would
                stop.start()
                stop.join()

    assert (caught.value.content, caught.value.reasoning) == ("Paris", "The user asks.")
    assert caught.value.content == text(seen, Content)


def test_a_call_cancelled_before_any_text_carries_empty_text(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, then_silent([chunk({"role": "assistant", "content": None}, n=0, progress=(42, 0, 42))]))
    client = client_kind.client_for(server, liveness_ms=2000)
    token = CancelToken()

    with pytest.raises(Cancelled) as caught:
        client.chat(REQ, lambda event: token.cancel(), cancel=token)

    assert (caught.value.content, caught.value.reasoning) == ("", "")


def test_a_call_cancelled_before_it_began_carries_empty_text(server: FakeServer, client_kind: Kind) -> None:
    token = CancelToken()
    token.cancel()

    with pytest.raises(Cancelled) as caught:
        client_kind.client_for(server).chat(REQ, cancel=token)

    assert (caught.value.content, caught.value.reasoning) == ("", "")


WORDS = 40
LONG = [
    chunk({"role": "assistant", "content": None}, n=0, progress=(42, 0, 42)),
    *(chunk({"content": f" w{n}"}, n=n) for n in range(1, WORDS + 1)),
    chunk(finish="stop", n=WORDS),
]


def test_after_a_re_send_the_cancelled_carries_only_the_text_since_it(server: FakeServer, client_kind: Kind) -> None:
    # The stream is cut, its replay forgotten: `chat_with_retry` sends the request again, and the
    # events start over. The answer shown is the re-send's alone, and so is what the cancel carries.
    ring = ReplayRing(LONG, cut_after=700)

    def forgotten(request: RecordedRequest) -> Reply:
        ring.forget()
        return ring.reattach(request)

    server.route(*CHAT, ring.chat)
    server.route("GET", "/v1/stream", forgotten)
    server.route(*STOP, ring.stop)
    client = client_kind.client_for(server)
    token, events = CancelToken(), list[ChatEvent]()

    def on_event(event: ChatEvent) -> None:
        events.append(event)
        resent = [e for e in events if isinstance(e, Retrying) and e.resend]
        if resent and sum(isinstance(e, Content) for e in events[events.index(resent[0]) :]) == 3:
            token.cancel()

    with pytest.raises(Cancelled) as caught:
        client.chat_with_retry(REQ, on_event, cancel=token)

    resend = next(i for i, e in enumerate(events) if isinstance(e, Retrying) and e.resend)
    assert text(events[:resend], Content), "the first attempt had shown some of the answer"
    assert caught.value.content == " w1 w2 w3" == text(events[resend:], Content)


def test_calls_ended_by_one_close_each_carry_their_own_text(server: FakeServer, client_kind: Kind) -> None:
    # `close()` ends every call with one and the same error: each call's carries its own answer.
    answers = {0: then_silent([chunk({"content": "Oslo"}, n=1)]), 1: then_silent([chunk({"content": "Rome"}, n=1)])}

    def by_slot(request: RecordedRequest) -> Reply:
        return answers[request.json()["id_slot"]]

    server.route(*CHAT, by_slot)
    client = client_kind.client_for(server, liveness_ms=2000)
    streaming = [threading.Event(), threading.Event()]
    outcomes: list[BaseException | None] = [None, None]

    def call(slot: int) -> None:
        req = ChatRequest(slot=slot, messages=[UserMessage("Name a capital.")])
        try:
            client.chat(req, lambda e: streaming[slot].set() if isinstance(e, Content) else None)
        except BaseException as exc:
            outcomes[slot] = exc

    threads = [threading.Thread(target=call, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    assert all(started.wait(2.0) for started in streaming)
    client.close()
    for thread in threads:
        thread.join(2.0)

    assert all(isinstance(o, ClientClosed) for o in outcomes), outcomes
    assert [o.content for o in outcomes if isinstance(o, ClientClosed)] == ["Oslo", "Rome"]
