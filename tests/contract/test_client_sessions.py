"""Sessions that outnumber the slots, through a whole client, both flavours, against a fake server
whose prompt cache and slot files behave as llama-server's (`tests/cache_server.py`): where each
session's request goes, the evicted session saved first, its checkpoint restored when it comes
back, the disk cap, and the slot gate unchanged."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import pytest

from adapters.fake_server import FakeServer, RecordedRequest, Reply, error_reply
from app.client import Client
from app.config import parse_config
from app.container import Container
from cache_server import ANSWER, CachingLlama
from client_support import LIMITS, NO_PROXY_LIMIT, RETRY, Kind
from domain.errors import RequestError
from domain.events import (
    CachePrediction,
    ChatEvent,
    Content,
    Queued,
    SessionMoved,
    SessionRestored,
    SessionSaved,
)
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, SystemMessage, UserMessage

pytestmark = [pytest.mark.timeout(20), pytest.mark.usefixtures("client_kind")]


def client_for(kind: Kind, server: FakeServer, *, predict: bool = False, mb: int = 99) -> Client:
    data: dict[str, Any] = {
        "proxy": NO_PROXY_LIMIT,
        "socket": server.socket_path,
        "limits": LIMITS,
        "retry": RETRY,
        "cache": {"predict": predict, "session_disk_mb": mb},
    }
    return kind.client_of(Container(config=parse_config(data)))


class Sessions:
    """Each session's history, one turn at a time, and what each turn saw."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.histories: dict[str, list[ChatMessage]] = {}

    def turn(self, session: str) -> list[ChatEvent]:
        system = SystemMessage(f"You are session {session}. " * 10)
        history = self.histories.setdefault(session, [system])
        history.append(UserMessage(f"Turn {len(history)} of {session}: name a capital."))
        events: list[ChatEvent] = []
        completion = self.client.chat(ChatRequest(session=session, messages=history), events.append)
        history.append(AssistantMessage(completion.content))
        return events


def chats(server: FakeServer) -> list[int]:
    """The slot of every chat the server received, in order."""
    return [r.json()["id_slot"] for r in server.requests if r.path == "/v1/chat/completions"]


def actions(server: FakeServer) -> list[str]:
    """Every slot action and chat, in order: `save 0`, `restore 1`, `chat 0`."""
    out = []
    for r in server.requests:
        if r.path.startswith("/slots/"):
            out.append(f"{r.target.split('action=')[1].split('&')[0]} {r.path.rsplit('/', 1)[1]}")
        elif r.path == "/v1/chat/completions":
            out.append(f"chat {r.json()['id_slot']}")
    return out


def of(kind: type, events: list[ChatEvent]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def test_each_session_goes_back_to_the_slot_that_holds_its_prompt(
    server: FakeServer,
    client_kind: Kind,
) -> None:
    llama = CachingLlama(server)
    sessions = Sessions(client_for(client_kind, server))
    first_a, first_b = sessions.turn("a"), sessions.turn("b")
    assert of(SessionMoved, first_a) == [SessionMoved("a", 0, None, None)]  # a free slot each
    assert of(SessionMoved, first_b) == [SessionMoved("b", 1, None, None)]
    for _ in range(2):
        assert of(SessionMoved, sessions.turn("a") + sessions.turn("b")) == []
    assert chats(server) == [0, 1, 0, 1, 0, 1]
    assert all(cached > 0 for cached in llama.cache_n[2:]), llama.cache_n
    assert [a for a in actions(server) if not a.startswith("chat")] == []  # nobody evicted


@pytest.mark.parametrize("predict", [False, True])
def test_a_third_session_evicts_the_least_recently_used_saving_it_first_and_it_comes_back_restored(
    server: FakeServer, client_kind: Kind, predict: bool
) -> None:
    llama = CachingLlama(server)
    sessions = Sessions(client_for(client_kind, server, predict=predict))
    sessions.turn("a")
    sessions.turn("b")
    sessions.turn("b")  # a is now the least recently used
    del server.requests[:]

    evicting = sessions.turn("c")

    assert of(SessionMoved, evicting) == [SessionMoved("c", 0, None, "a")]
    [saved] = of(SessionSaved, evicting)
    assert (saved.session, saved.slot, saved.tokens) == (
        "a",
        0,
        len(llama.files[next(iter(llama.files))]),
    )
    assert saved.bytes == 100 * saved.tokens and saved.ms >= 0
    assert actions(server) == [
        "save 0",
        "chat 0",
    ]  # saved while the slot is ours, before it is overwritten
    del server.requests[:]

    back = sessions.turn("a")  # slot 1 (b) is now the least recently used

    assert of(SessionMoved, back) == [SessionMoved("a", 1, 0, "b")]
    [restored] = of(SessionRestored, back)
    assert (restored.session, restored.slot, restored.tokens) == ("a", 1, saved.tokens)
    assert actions(server) == ["save 1", "restore 1", "chat 1"]
    assert llama.cache_n[-1] >= saved.tokens - 16, "a reused its restored prompt"
    if predict:
        [prediction] = of(CachePrediction, back)
        assert prediction.restored == saved.tokens and prediction.reused == llama.cache_n[-1]
        assert back.index(restored) < back.index(prediction)


def test_the_disk_cap_drops_the_oldest_checkpoint_first_and_reuses_its_file(
    server: FakeServer, client_kind: Kind
) -> None:
    llama = CachingLlama(server)
    llama.bytes_per_token = 2500  # about 0.6 MB a checkpoint here: one fits under 1 MB, not two
    sessions = Sessions(client_for(client_kind, server, mb=1))
    for session in "abcd":  # c evicts a (saved), d evicts b (saved: a, the oldest, is dropped)
        sessions.turn(session)
    assert len(llama.files) == 2
    del server.requests[:]

    back = sessions.turn("a")  # evicts c, whose checkpoint takes a's dropped file (b's is dropped)

    assert of(SessionRestored, back) == [], "a's checkpoint was dropped: it starts cold"
    assert [e.session for e in of(SessionSaved, back)] == ["c"]
    assert actions(server) == ["save 0", "chat 0"]
    assert len(llama.files) == 2, "no file past the cap: the dropped one was overwritten"
    turn = sessions.turn("b")  # b's, older than c's, was dropped; b evicts d: c's is dropped
    assert of(SessionRestored, turn) == [] and [e.session for e in of(SessionSaved, turn)] == ["d"]
    again = sessions.turn("d")  # the newest checkpoint, on record: restored
    assert [e.session for e in of(SessionRestored, again)] == ["d"]
    assert len(llama.files) == 2


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (ChatRequest(messages=[UserMessage("hi")]), "needs slot= or session="),
        (ChatRequest(slot=0, messages=[UserMessage("hi")], session="a"), "not both"),
        (ChatRequest(messages=[UserMessage("hi")], session="line\nbreak"), "control character"),
        (ChatRequest(messages=[UserMessage("hi")], session=""), "must not be empty"),
    ],
)
def test_a_bad_slot_and_session_pair_is_refused_before_anything_connects(
    server: FakeServer, client_kind: Kind, req: ChatRequest, message: str
) -> None:
    CachingLlama(server)
    client = client_for(client_kind, server)
    with pytest.raises(RequestError, match=message):
        client.chat(req)
    with pytest.raises(RequestError, match=message):
        client.chat_with_retry(req)
    assert server.requests == []


def test_a_sessions_request_has_no_body_before_it_is_placed(
    server: FakeServer,
    client_kind: Kind,
) -> None:
    client = client_for(client_kind, server)
    with pytest.raises(RequestError, match="request has one once it is sent"):
        client.render(ChatRequest(session="a", messages=[UserMessage("hi")]))
    assert server.requests == []


def test_two_sessions_racing_for_one_slot_take_turns_at_the_gate(
    server: FakeServer,
    client_kind: Kind,
) -> None:
    llama = CachingLlama(server, slots=1)
    started = threading.Barrier(2)
    slow = llama._chat

    def chat(request: RecordedRequest) -> Reply:
        return dataclasses.replace(slow(request), head_delay_s=0.1)

    server.route("POST", "/v1/chat/completions", chat)
    client = client_for(client_kind, server)
    client.props()  # the slot count, learned before the race
    seen: dict[str, list[ChatEvent]] = {}
    failures: list[BaseException] = []

    def session(name: str) -> None:
        events: list[ChatEvent] = []
        seen[name] = events
        started.wait()
        try:
            req = ChatRequest(session=name, messages=[UserMessage(f"I am {name}.")])
            client.chat(req, events.append)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=session, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert failures == []
    first, second = sorted("ab", key=lambda name: any(isinstance(e, Queued) for e in seen[name]))
    assert of(Queued, seen[second]) == [Queued(1)], "the second waited at the gate"
    assert of(Queued, seen[first]) == []
    assert actions(server) == [
        "chat 0",
        "save 0",
        "chat 0",
    ]  # never two at once, the first saved between
    assert of(SessionMoved, seen[second]) == [SessionMoved(second, 0, None, first)]


def test_a_server_without_a_save_folder_still_places_sessions_with_one_warning(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    CachingLlama(server, save_path=False)
    sessions = Sessions(client_for(client_kind, server))
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        for session in "abcab":
            events = sessions.turn(session)
            assert of(SessionSaved, events) == of(SessionRestored, events) == []
    assert chats(server) == [0, 1, 0, 1, 0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    off = "slot checkpoints off: the server keeps none (HTTP 501: started without --slot-save-path)"
    assert warnings == [off]


def test_slot_requests_work_as_before_beside_sessions(
    server: FakeServer,
    client_kind: Kind,
) -> None:
    llama = CachingLlama(server)
    client = client_for(client_kind, server)
    sessions = Sessions(client)
    sessions.turn("a")
    completion = client.chat(ChatRequest(0, [UserMessage("pinned")]))  # a's prompt, overwritten
    assert completion.content == ANSWER
    events = sessions.turn("a")  # slot 0 no longer holds a's prompt: a takes the free slot 1
    assert of(SessionMoved, events) == [SessionMoved("a", 1, 0, None)]
    assert chats(server) == [0, 0, 1]
    assert llama.cache_n[-1] == 0


def test_a_save_that_fails_never_fails_the_turn_and_the_evicted_session_starts_cold(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    llama = CachingLlama(server)
    sessions = Sessions(client_for(client_kind, server))
    sessions.turn("a")
    sessions.turn("b")
    server.route("POST", "/slots/0", error_reply(500, "disk full"))
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        evicting = sessions.turn("c")  # evicts a: its save fails
    assert of(SessionSaved, evicting) == [] and Content(ANSWER) in evicting
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    lost = "slot 0: the prompt of the session it held was not saved: HttpError (HTTP 500)"
    assert warnings == [lost]
    back = sessions.turn("a")  # evicts b (slot 1 saves fine), and has nothing to restore
    assert [e.session for e in of(SessionSaved, back)] == ["b"] and of(SessionRestored, back) == []
    opening = len("<system>You are session ")
    assert llama.cache_n[-1] == opening, "only what every session's prompt opens with"
