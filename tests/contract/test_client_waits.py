"""The brief's timing rows against the fake server over a real Unix socket: every wait and every
silence ends in a defined way, with the exact events before it.

Every limit is set between 50 and 200 ms through `Config`: polls every 100 ms, the wait budgets
at 150 ms (halfway between the first and the second poll, so a poll up to 50 ms late changes no
count), liveness at 100 ms. Where a test needs "a while", the fake server
is told by the client's own polls when to answer (a handler waits for the N-th `/slots` poll),
not by a clock.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest

from adapters.fake_server import (
    End,
    FakeServer,
    Piece,
    Raw,
    RecordedRequest,
    Reply,
    Script,
    loading,
    silence,
    slots_reply,
    sse_event,
    sse_reply,
)
from client_support import (
    ANSWER,
    ANSWER_COMPLETION,
    ANSWER_EVENTS,
    CHAT,
    REQ,
    ROLE,
    SLOTS,
    Kind,
    chunk,
    config_for,
    overridden,
    recorded,
)
from domain.chat_stream import REPLAY_OVERLAP_BYTES
from domain.completion import FinishReason
from domain.errors import HttpError, LoadTimeout, Stalled, StreamClosedEarly, WaitTimeout
from domain.events import ChatEvent, Content, ModelWait, Progress, Reasoning, Retrying, Waiting

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]


def answer_after_polls(server: FakeServer, polls: int, slots: Script, answer: Script) -> None:
    """`/slots` answers `slots`; the chat's answer starts only once the client polled `polls`
    times (its head leaves right after the last poll's answer, far from the next poll)."""
    polled = threading.Event()
    count = 0
    lock = threading.Lock()

    def slots_handler(request: RecordedRequest) -> Script:
        nonlocal count
        with lock:
            count += 1
            if count >= polls:
                polled.set()
        return slots

    def chat_handler(request: RecordedRequest) -> Script:
        if not polled.wait(5.0):
            raise AssertionError(f"the client never polled /slots {polls} times")
        return answer

    server.route(*SLOTS, slots_handler)
    server.route(*CHAT, chat_handler)


# -- before the first byte ------------------------------------------------------------------------


def test_busy_slot_emits_waiting_busy_per_poll_then_the_answer_completes(server: FakeServer, client_kind: Kind) -> None:
    answer_after_polls(server, 2, slots_reply([True, False]), sse_reply(ANSWER))
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server, timed=True, poll_ms=50, busy_wait_ms=200).chat(REQ, events.append)

    assert events == [Waiting(slot_busy=True), Waiting(slot_busy=True), *ANSWER_EVENTS]
    assert completion == ANSWER_COMPLETION
    assert len(recorded(server, SLOTS)) == 2
    assert len(recorded(server, CHAT)) == 1


def test_slot_busy_past_busy_wait_is_wait_timeout_and_the_request_is_dropped(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*SLOTS, slots_reply([True, False]))
    server.route(*CHAT, silence())
    events: list[ChatEvent] = []
    started = time.monotonic()

    with pytest.raises(WaitTimeout, match="slot 0 stayed busy"):
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    # Polls at 100 and 200 ms: the second reaches the 150 ms budget.
    assert events == [Waiting(slot_busy=True)] * 2
    assert 0.15 <= time.monotonic() - started < 2.0
    (request,) = recorded(server, CHAT)
    assert request.client_closed.wait(2.0), "the queued request's connection is closed (it leaves the queue)"


def _refusing_socket(folder: str) -> tuple[socket.socket, str]:
    """A socket file that is bound but never listens: connecting to it is ECONNREFUSED."""
    path = os.path.join(folder, "refusing.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    return sock, path


@pytest.mark.parametrize("how", ["refused", "503 loading", "closed without an answer"])
def test_slots_unavailable_past_load_wait_is_load_timeout(
    server: FakeServer, tmp_path: Any, how: str, client_kind: Kind
) -> None:
    server.route(*CHAT, silence())
    config = config_for(server.socket_path, timed=True)
    refusing: socket.socket | None = None
    overrides: dict[str, Any] = {}
    if how == "refused":
        refusing, path = _refusing_socket(str(tmp_path))
        overrides.update(client_kind.probe_on(path, timeout=0.1, body_bytes=4 * 1024 * 1024))
    elif how == "503 loading":
        server.route(*SLOTS, loading())
    else:
        server.route(*SLOTS, Raw((), End.CLOSE))
    events: list[ChatEvent] = []
    try:
        with overridden() as make, pytest.raises(LoadTimeout, match=r"unavailable|loading"):
            client_kind.client_of(make(config, **overrides)).chat(REQ, events.append)
    finally:
        if refusing is not None:
            refusing.close()

    loading_said = ModelWait.LOADING if how == "503 loading" else None
    assert events == [Waiting(slot_busy=False, model=loading_said)] * 2
    (request,) = recorded(server, CHAT)
    assert request.client_closed.wait(2.0)


def test_slots_503_while_loading_then_the_server_answers_completes(server: FakeServer, client_kind: Kind) -> None:
    answer_after_polls(server, 2, loading(), sse_reply(ANSWER))
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server, timed=True, poll_ms=50, load_wait_ms=200).chat(REQ, events.append)

    assert events == [Waiting(slot_busy=False, model=ModelWait.LOADING)] * 2 + ANSWER_EVENTS
    assert completion == ANSWER_COMPLETION


def test_idle_slot_and_no_byte_past_idle_grace_is_stalled(server: FakeServer, client_kind: Kind) -> None:
    server.route(*SLOTS, slots_reply([False, False]))
    server.route(*CHAT, silence())
    events: list[ChatEvent] = []

    with pytest.raises(Stalled, match="slot 0 was idle with no answer"):
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert events == [Waiting(slot_busy=False)] * 2
    (request,) = recorded(server, CHAT)
    assert request.client_closed.wait(2.0)


def test_a_slot_that_flips_between_busy_and_idle_cannot_wait_forever(server: FakeServer, client_kind: Kind) -> None:
    # Busy and idle time are charged separately and neither is reset by the other.
    replies = [slots_reply([True, False]), slots_reply([False, False])] * 10
    server.route(*SLOTS, *replies)
    server.route(*CHAT, silence())
    events: list[ChatEvent] = []

    with pytest.raises(WaitTimeout):
        client_kind.client_for(server, timed=True, idle_grace_ms=200, busy_wait_ms=150).chat(REQ, events.append)

    # busy, idle, busy: the second busy poll brings the busy time to 200 ms; the idle poll
    # between them neither resets it nor reaches the 200 ms idle grace.
    assert events == [Waiting(True), Waiting(False), Waiting(True)]


# -- after the first byte -------------------------------------------------------------------------

PING = b":\n\n"


@pytest.mark.parametrize("first", ["head only", "one data event"], ids=["after-head", "after-data"])
def test_only_keep_alive_comments_past_liveness_is_stalled(server: FakeServer, first: str, client_kind: Kind) -> None:
    # Pings every 30 ms would go on for 1.5 s: comments are not data and keep nothing alive.
    lead = [chunk(ROLE, n=0, progress=(42, 0, 0))] if first == "one data event" else []
    server.route(*CHAT, sse_reply([*lead, *[PING] * 50], delay_s=0.03, done=False, end=End.SILENCE))
    events: list[ChatEvent] = []
    started = time.monotonic()

    with pytest.raises(Stalled, match=r"no data for \d+ ms \(liveness limit 100 ms\)"):
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    elapsed = time.monotonic() - started
    # The stall is a break to pick up: one re-attach (refused here: no replay), then the error.
    *data, retrying = events
    assert data == ([Progress(42, 0, 0)] if lead else [])
    assert isinstance(retrying, Retrying) and (retrying.attempt, retrying.after_ms) == (2, 50)
    assert retrying.error.startswith("Stalled: no data for")
    assert len(recorded(server, ("GET", "/v1/stream"))) == 1
    # Stalled one liveness period after the head or the data event (at 0 or 30 ms), then the 50 ms
    # retry wait and the refused re-attach, long before the pings end at 1.5 s: a client whose
    # pings moved the deadline would stall at 1.6 s.
    assert 0.15 <= elapsed < 0.6
    assert recorded(server, SLOTS) == [], "once the head arrived the slot is ours: no /slots poll"
    (request,) = recorded(server, CHAT)
    assert request.client_closed.wait(2.0)


def test_silence_after_the_first_event_is_stalled(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Par"}, n=1)], done=False, end=End.SILENCE))
    events: list[ChatEvent] = []
    started = time.monotonic()

    with pytest.raises(Stalled, match="liveness limit 100 ms"):
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    # One re-attach after the stall (refused here: no replay), after the 50 ms retry wait.
    content, retrying = events
    assert content == Content("Par")
    assert isinstance(retrying, Retrying) and (retrying.attempt, retrying.after_ms) == (2, 50)
    assert retrying.error.startswith("Stalled: ")
    assert len(recorded(server, ("GET", "/v1/stream"))) == 1
    assert 0.15 <= time.monotonic() - started < 2.0
    (request,) = recorded(server, CHAT)
    assert request.client_closed.wait(2.0)


def test_progress_events_alone_keep_a_long_prompt_alive_past_liveness(server: FakeServer, client_kind: Kind) -> None:
    # Sixteen prompt batches 30 ms apart: 480 ms of prompt processing under a 100 ms liveness limit.
    batches = [chunk(ROLE, n=0, progress=(4096, 0, 256 * i)) for i in range(16)]
    tail = [chunk({"content": "Done"}, n=1), chunk(finish="stop", n=1)]
    server.route(*CHAT, sse_reply([*batches, *tail], delay_s=0.03))
    events: list[ChatEvent] = []
    started = time.monotonic()

    completion = client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert time.monotonic() - started >= 0.4
    assert events == [*(Progress(4096, 0, 256 * i) for i in range(16)), Content("Done")]
    assert completion.content == "Done"
    assert completion.finish_reason is FinishReason.STOP


def test_reasoning_deltas_keep_the_stream_alive_too(server: FakeServer, client_kind: Kind) -> None:
    pieces = [chunk({"reasoning_content": f" r{i}"}, n=i) for i in range(1, 6)]
    server.route(*CHAT, sse_reply([*pieces, chunk({"content": "ok"}, n=6), chunk(finish="stop", n=6)], delay_s=0.03))
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert events == [*(Reasoning(f" r{i}") for i in range(1, 6)), Content("ok")]
    assert completion.reasoning_content == " r1 r2 r3 r4 r5"
    assert completion.reasoning_tokens == 5


# -- how a stream ends ----------------------------------------------------------------------------


def test_a_cut_connection_mid_stream_is_stream_closed_early(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER[:2], done=False, end=End.RESET))
    events: list[ChatEvent] = []

    with pytest.raises(StreamClosedEarly, match="connection closed"):
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    # The cut is one re-attach from the bytes read (refused here: no replay), then the error.
    *answered, retrying = events
    assert answered == ANSWER_EVENTS[:2]
    assert isinstance(retrying, Retrying) and (retrying.attempt, retrying.after_ms) == (2, 50)
    assert retrying.error.startswith("StreamClosedEarly: POST /v1/chat/completions: connection closed")
    (chat,) = recorded(server, CHAT)
    (reattach,) = recorded(server, ("GET", "/v1/stream"))
    read = sum(len(sse_event(event)) for event in ANSWER[:2])  # the body bytes read
    assert len(sse_event(ANSWER[1])) > REPLAY_OVERLAP_BYTES  # whatever the reads: the last bytes read are asked again
    offset = read - REPLAY_OVERLAP_BYTES
    assert reattach.target == f"/v1/stream?conv_id={chat.header('x-conversation-id')}&from={offset}"
    assert reattach.time - chat.time >= 0.05


def test_a_clean_close_without_finish_reason_is_stream_closed_early(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER[:3], done=False, end=End.CLOSE))
    events: list[ChatEvent] = []

    with pytest.raises(StreamClosedEarly, match="no finish_reason after 3 chunks"):
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert events == ANSWER_EVENTS


def test_done_without_finish_reason_is_stream_closed_early(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER[:3], done=True))
    events: list[ChatEvent] = []

    with pytest.raises(StreamClosedEarly, match="no finish_reason"):
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert events == ANSWER_EVENTS


def test_a_clean_close_after_the_final_chunk_without_done_completes(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER, done=False, end=End.CLOSE))
    events: list[ChatEvent] = []

    assert client_kind.client_for(server, timed=True).chat(REQ, events.append) == ANSWER_COMPLETION
    assert events == ANSWER_EVENTS


def test_a_cut_after_the_final_chunk_still_completes(server: FakeServer, client_kind: Kind) -> None:
    # Only `[DONE]` and the zero-size chunk are missing: nothing of the answer is.
    server.route(*CHAT, sse_reply(ANSWER, done=False, end=End.RESET))
    events: list[ChatEvent] = []

    assert client_kind.client_for(server, timed=True).chat(REQ, events.append) == ANSWER_COMPLETION
    assert events == ANSWER_EVENTS


def test_an_error_event_inside_a_200_stream_is_its_http_error(server: FakeServer, client_kind: Kind) -> None:
    error = {"error": {"code": 500, "message": "failed to decode the batch", "type": "server_error"}}
    server.route(*CHAT, sse_reply([*ANSWER[:2], error], done=False))
    events: list[ChatEvent] = []

    with pytest.raises(HttpError) as caught:
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert events == ANSWER_EVENTS[:2]
    assert caught.value.status == 500
    assert caught.value.body == '{"error":{"code":500,"message":"failed to decode the batch","type":"server_error"}}'


def test_an_old_style_error_field_inside_a_200_stream_is_its_http_error(server: FakeServer, client_kind: Kind) -> None:
    text = '{"code":503,"message":"Loading model","type":"unavailable_error"}'
    server.route(*CHAT, sse_reply([ANSWER[1], b"error: " + text.encode() + b"\n\n"], done=False))
    events: list[ChatEvent] = []

    with pytest.raises(HttpError) as caught:
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert events == [Content("Paris")]
    assert (caught.value.status, caught.value.body) == (503, text)


def test_the_head_is_awaited_only_until_it_arrives_then_liveness_rules(server: FakeServer, client_kind: Kind) -> None:
    # A head 150 ms late (one poll, at 100 ms), then the body with gaps under the liveness limit.
    server.route(*SLOTS, slots_reply([True, False]))
    pieces = [Piece(0.03, sse_event(c)) for c in ANSWER] + [Piece(0.03, sse_event("[DONE]"))]
    server.route(*CHAT, Reply(200, (("Content-Type", "text/event-stream"),), pieces, chunked=True, head_delay_s=0.15))
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert events == [Waiting(slot_busy=True), *ANSWER_EVENTS]
    assert completion == ANSWER_COMPLETION
