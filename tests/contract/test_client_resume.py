"""A turn survives a cut stream: the client re-attaches to the server's replay of the body instead
of sending the request again, and stops every generation it walks away from.

Every chat request carries a fresh conversation id (`X-Conversation-Id`, 128 random bits). When
the stream breaks after its head (a reset, a close, silence past the liveness limit), the client
asks `GET /v1/stream?conv_id=ID&from=N` for the body from the N bytes it consumed, on a new
connection, with the slot still held, and feeds it into the same stream: the events go on without
a repeat, and the answer equals an uncut one. A refusal (404: forgotten or no replay; 400: the
offset left the ring) falls back to sending the request again under a new id, when the call may
(`chat_with_retry`); `chat()` then raises the cut. Every end but the answer `DELETE`s the
conversation, since with the header closing the connection no longer stops the server. Against
the fake server's `ReplayRing`, over both clients.
"""

from __future__ import annotations

import logging
import re
import threading

import pytest

from adapters.fake_server import End, FakeServer, Raw, ReplayRing, error_reply, json_reply, not_found, silence
from client_support import ANSWER_COMPLETION, CHAT, CONTROL, REQ, SLOTS, STOP, Kind, chunk, recorded
from domain.cancel import CancelToken
from domain.chat_stream import REPLAY_OVERLAP_BYTES
from domain.completion import Completion
from domain.errors import Cancelled, ProtocolError, StreamClosedEarly, ThinkingOverrun
from domain.events import ChatEvent, Content, Progress, Retrying

pytestmark = [pytest.mark.timeout(20), pytest.mark.usefixtures("client_kind")]

STREAM = ("GET", "/v1/stream")
WORDS = 120
LONG = [
    chunk({"role": "assistant", "content": None}, n=0, progress=(42, 0, 42)),
    *(chunk({"content": f" w{n}"}, n=n) for n in range(1, WORDS + 1)),
    chunk(finish="stop", n=WORDS),
]
LONG_TEXT = "".join(f" w{n}" for n in range(1, WORDS + 1))


def served(server: FakeServer, ring: ReplayRing) -> ReplayRing:
    server.route(*CHAT, ring.chat)
    server.route(*STREAM, ring.reattach)
    server.route(*STOP, ring.stop)
    return ring


def content(events: list[ChatEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Content))


def uncut(server: FakeServer, client_kind: Kind) -> tuple[Completion, list[ChatEvent]]:
    events: list[ChatEvent] = []
    served(server, ReplayRing(LONG))
    completion = client_kind.client_for(server).chat(REQ, events.append)
    return completion, [e for e in events if not isinstance(e, Retrying)]


@pytest.mark.parametrize("retry", [False, True], ids=["chat", "chat_with_retry"])
def test_a_stream_cut_mid_event_is_picked_up_where_it_broke_and_the_answer_is_exact(
    server: FakeServer, client_kind: Kind, retry: bool
) -> None:
    expected, expected_events = uncut(server, client_kind)
    server.requests.clear()
    ring = served(server, ReplayRing(LONG, cut_after=2048, cut=End.RESET))
    client = client_kind.client_for(server)
    events: list[ChatEvent] = []

    completion = (client.chat_with_retry if retry else client.chat)(REQ, events.append)

    assert completion == expected
    assert [e for e in events if not isinstance(e, Retrying)] == expected_events, "no event twice, none lost"
    assert content(events) == LONG_TEXT
    (retrying,) = [e for e in events if isinstance(e, Retrying)]
    assert retrying.attempt == 2 and retrying.error.startswith("StreamClosedEarly")
    assert len(recorded(server, CHAT)) == 1, "the request is sent once"
    assert ring.offsets == [2048 - REPLAY_OVERLAP_BYTES], "re-attached from the bytes consumed, less the overlap"
    assert ring.stopped == [], "an answer stops nothing"


def test_a_re_attach_cut_again_is_picked_up_again_from_the_new_offset(server: FakeServer, client_kind: Kind) -> None:
    ring = served(server, ReplayRing(LONG, cut_after=1000, reattach_cut=8000))
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server, retry={"attempts": 8, "delays_ms": [20] * 7}).chat_with_retry(
        REQ, events.append
    )

    assert completion.content == LONG_TEXT
    # Each re-attach asks again for the last bytes read (at most the overlap: the last read's),
    # and each replay is cut 8000 bytes past where it began.
    broke_at = [1000] + [offset + 8000 for offset in ring.offsets[:-1]]
    assert all(0 < at - offset <= REPLAY_OVERLAP_BYTES for at, offset in zip(broke_at, ring.offsets, strict=True))
    assert ring.offsets[-1] + 8000 >= len(ring.body)
    assert len(ring.offsets) >= 3
    assert len(recorded(server, CHAT)) == 1
    assert [e.attempt for e in events if isinstance(e, Retrying)] == list(range(2, len(ring.offsets) + 2))


def test_every_request_carries_a_fresh_128_bit_conversation_id(server: FakeServer, client_kind: Kind) -> None:
    ring = served(server, ReplayRing(LONG))
    client = client_kind.client_for(server)
    for _ in range(3):
        client.chat(REQ, lambda event: None)
    assert len(set(ring.conversations)) == 3
    assert all(re.fullmatch(r"[0-9a-f]{32}", c) for c in ring.conversations)


@pytest.mark.parametrize("refusal", ["forgotten", "offset lost"])
def test_a_refused_re_attach_sends_the_request_again_under_a_new_id(
    server: FakeServer, client_kind: Kind, refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="inferpath")
    ring = served(server, ReplayRing(LONG, cut_after=2048))
    if refusal == "forgotten":
        original = ring.reattach
        server.route(*STREAM, lambda request: (ring.forget(), original(request))[1])
    else:
        ring.dropped = 4096  # the ring no longer holds byte 2048
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server).chat_with_retry(REQ, events.append)

    assert completion.content == LONG_TEXT
    first, second = recorded(server, CHAT)
    assert first.body == second.body, "the very same bytes"
    assert ring.conversations[0] != ring.conversations[1]
    assert ring.stopped[:1] == [ring.conversations[0]], "the first generation is stopped before the second"
    # The re-attach's Retrying, then the re-send's at once: the events after it start over, and a
    # caller that shows the answer as it comes knows to clear what it showed.
    reattach, resend = (e for e in events if isinstance(e, Retrying))
    assert (reattach.resend, resend.resend, resend.after_ms) == (False, True, 0)
    after = events[events.index(resend) + 1 :]
    assert content(after) == LONG_TEXT, "the answer from its start, once"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(": ", 1)[1].split(" after ")[0] for w in warnings] == [
        "re-attach at body byte 2048 as attempt 2 in 50 ms",
        "re-send at once within attempt 2",
    ]


@pytest.mark.parametrize("retry", [False, True], ids=["chat", "chat_with_retry"])
def test_re_attaches_that_cannot_connect_end_in_the_cut_not_a_connect_error(
    server: FakeServer, client_kind: Kind, retry: bool
) -> None:
    # The server goes away with the stream half sent: every re-attach finds no socket. The call
    # ends as the error table says of a stream that could not be picked up again.
    served(server, ReplayRing(LONG, cut_after=900))
    client = client_kind.client_for(server)
    retries: list[Retrying] = []

    def on_event(event: ChatEvent) -> None:
        if isinstance(event, Retrying):
            retries.append(event)
            server.stop()  # before the first re-attach

    with pytest.raises(StreamClosedEarly, match="the stream could not be picked up again: cannot connect to"):
        (client.chat_with_retry if retry else client.chat)(REQ, on_event)
    assert len(retries) == 3, "every attempt left was a re-attach"
    assert all(not r.resend for r in retries)
    assert retries[1].error.startswith("StreamClosedEarly: the stream could not be picked up again: cannot connect")


@pytest.mark.parametrize("retry", [False, True], ids=["chat", "chat_with_retry"])
def test_a_re_attach_answered_503_is_tried_again_later_and_the_answer_is_exact(
    server: FakeServer, client_kind: Kind, retry: bool
) -> None:
    # llama-server answers 503 to everything while it loads: the stream is not refused, only not
    # to be had yet, so the next re-attach (under the retry schedule) may get it; for chat() too.
    ring = served(server, ReplayRing(LONG, cut_after=2048))
    answers = iter([lambda request: error_reply(503, "Loading model", "unavailable_error")])
    server.route(*STREAM, lambda request: next(answers, ring.reattach)(request))
    events: list[ChatEvent] = []

    completion = (client_kind.client_for(server).chat_with_retry if retry else client_kind.client_for(server).chat)(
        REQ, events.append
    )

    assert completion.content == LONG_TEXT
    assert content(events) == LONG_TEXT, "no event twice, none lost"
    first, second = (e for e in events if isinstance(e, Retrying))
    assert not first.resend and not second.resend, "two re-attaches, no re-send"
    assert second.error.startswith("StreamClosedEarly: GET /v1/stream: the server answered 503")
    assert len(recorded(server, CHAT)) == 1
    assert ring.offsets == [2048 - REPLAY_OVERLAP_BYTES], "the 503 came before the ring was asked"


def test_a_clean_end_without_the_final_chunk_is_sent_again_not_re_attached(
    server: FakeServer, client_kind: Kind
) -> None:
    ring = served(server, ReplayRing(LONG, cut_after=2048, cut=End.CLOSE))  # the body ends cleanly there

    assert client_kind.client_for(server).chat_with_retry(REQ, lambda event: None).content == LONG_TEXT
    assert ring.offsets == []
    assert len(recorded(server, CHAT)) == 2
    assert ring.stopped == ring.conversations[:1]


def test_chat_raises_the_cut_when_the_re_attach_is_refused_and_sends_nothing_twice(
    server: FakeServer, client_kind: Kind
) -> None:
    ring = served(server, ReplayRing(LONG, cut_after=2048))
    server.route(*STREAM, lambda request: json_reply({"error": {"code": 404}}, 404))

    with pytest.raises(StreamClosedEarly):
        client_kind.client_for(server).chat(REQ, lambda event: None)

    assert len(recorded(server, CHAT)) == 1
    assert ring.stopped == ring.conversations[:1]


def test_the_cut_chat_raises_is_the_streams_not_a_failed_re_attach_before_the_refusal(
    server: FakeServer, client_kind: Kind
) -> None:
    served(server, ReplayRing(LONG, cut_after=2048))
    answers = iter([json_reply({"error": {"code": 503, "message": "Loading model"}}, 503), not_found()])
    server.route(*STREAM, lambda request: next(answers))
    events: list[ChatEvent] = []

    with pytest.raises(StreamClosedEarly, match=r"^POST /v1/chat/completions: connection closed after chunk"):
        client_kind.client_for(server).chat(REQ, events.append)

    retried = [e.error for e in events if isinstance(e, Retrying)]
    assert [error.split(":")[1].strip() for error in retried] == ["POST /v1/chat/completions", "GET /v1/stream"]
    assert len(recorded(server, CHAT)) == 1


@pytest.mark.parametrize("skew", [-2, 1, 3])
def test_a_replay_from_a_few_bytes_off_is_a_protocol_error_where_its_json_would_still_parse(
    server: FakeServer, client_kind: Kind, skew: int
) -> None:
    # Cut inside a content string: a few bytes off there, the events still parse, and the
    # answer would come out silently wrong; the replay's first bytes are checked instead.
    body = ReplayRing(LONG).body
    inside = body.find(b'"content":" w50"') + len(b'"content":" w5')
    ring = served(server, ReplayRing(LONG, cut_after=inside, skew=skew))

    with pytest.raises(ProtocolError, match="the replay does not begin where the stream broke"):
        client_kind.client_for(server).chat_with_retry(REQ, lambda event: None)

    assert len(ring.offsets) == 1, "not retried: the server's replay is wrong"
    assert len(recorded(server, CHAT)) == 1
    assert ring.stopped == ring.conversations[:1], "its generation was stopped"


def test_a_refused_re_attach_after_a_mended_cut_raises_the_cut_after_it(server: FakeServer, client_kind: Kind) -> None:
    # Cut A is mended by a re-attach, whose replay is cut in turn (B); the next re-attach is
    # refused: the cut raised is B, the one it would have mended.
    ring = served(server, ReplayRing(LONG, cut_after=1000, reattach_cut=4000))
    answers = iter([ring.reattach, lambda request: not_found()])
    server.route(*STREAM, lambda request: next(answers)(request))

    with pytest.raises(StreamClosedEarly, match=r"^GET /v1/stream\?conv_id=\.\.\.&from=\d+: connection closed"):
        client_kind.client_for(server).chat(REQ, lambda event: None)

    assert len(recorded(server, CHAT)) == 1


def test_a_stop_the_server_breaks_off_unanswered_ends_the_call_as_its_cancel(
    server: FakeServer, client_kind: Kind
) -> None:
    served(server, ReplayRing(LONG, cut_after=2048, cut=End.SILENCE))
    server.route(*STOP, Raw((), End.RESET))  # the DELETE's connection reset, no answer
    token = CancelToken()

    def on_event(event: ChatEvent) -> None:
        if isinstance(event, Content):
            token.cancel()

    with pytest.raises(Cancelled):
        client_kind.client_for(server, liveness_ms=2000).chat(REQ, on_event, cancel=token)
    assert len(recorded(server, STOP)) == 1


def test_a_stream_silent_past_the_liveness_limit_is_picked_up_too(server: FakeServer, client_kind: Kind) -> None:
    ring = served(server, ReplayRing(LONG, cut_after=2048, cut=End.SILENCE))
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert completion.content == LONG_TEXT
    (retrying,) = [e for e in events if isinstance(e, Retrying)]
    assert retrying.error.startswith("Stalled")
    assert ring.offsets == [2048 - REPLAY_OVERLAP_BYTES]


def test_a_cancelled_call_stops_its_generation(server: FakeServer, client_kind: Kind) -> None:
    ring = served(server, ReplayRing(LONG, cut_after=2048, cut=End.SILENCE))
    token = CancelToken()
    got = threading.Event()

    def on_event(event: ChatEvent) -> None:
        if isinstance(event, Content):
            got.set()
            token.cancel()

    with pytest.raises(Cancelled):
        client_kind.client_for(server, liveness_ms=2000).chat(REQ, on_event, cancel=token)

    assert got.is_set()
    assert ring.stopped == ring.conversations


def test_a_call_that_gives_up_stops_its_generation(server: FakeServer, client_kind: Kind) -> None:
    reasoning = [chunk({"reasoning_content": "hm"}, n=n) for n in range(1, 40)]
    ring = served(server, ReplayRing([LONG[0], *reasoning]))
    server.route(*CONTROL, json_reply({"success": False}))

    with pytest.raises(ThinkingOverrun):
        client_kind.client_for(server, thinking_cap=2, thinking_overrun=4).chat(REQ, lambda event: None)

    assert ring.stopped == ring.conversations


def test_a_request_queued_on_the_server_is_stopped_when_the_call_ends_before_its_head(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True}]))
    server.route(*CHAT, silence())
    ring = ReplayRing(LONG)
    server.route(*STOP, ring.stop)
    conversations: list[str] = []

    with pytest.raises(Exception):  # noqa: B017 - WaitTimeout, whichever the budget
        client_kind.client_for(server, timed=True).chat(REQ, lambda event: None)

    conversations = [r.header("x-conversation-id") or "" for r in recorded(server, CHAT)]
    assert ring.stopped == conversations


def test_an_answer_equals_the_uncut_one_event_for_event(server: FakeServer, client_kind: Kind) -> None:
    completion, events = uncut(server, client_kind)
    assert completion.content == LONG_TEXT
    assert isinstance(events[0], Progress)
    assert ANSWER_COMPLETION.finish_reason == completion.finish_reason
