"""Each retry goes back through the slot gate, against the fake server with two callers on one
slot: while caller A waits to retry, caller B gets the slot, and A's retry queues behind B.

Steered by events, not sleeps: A's `Retrying` callback (emitted before the wait) starts B and
waits until B's request reaches the server or B is queued; the server holds B's answer until A,
back from its 50 ms wait, has queued behind B. Polls are every 200 ms, so B's held answer (about
50 ms) costs it no `/slots` poll.
"""

from __future__ import annotations

import threading

import pytest

from adapters.fake_server import FakeServer, RecordedRequest, Script, loading, sse_reply
from client_support import ANSWER, ANSWER_COMPLETION, ANSWER_EVENTS, CHAT, REQ, Kind, recorded
from domain.completion import Completion
from domain.errors import InferError
from domain.events import ChatEvent, Queued, Retrying

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

LOADING_ERROR = 'HttpError: HTTP 503: {"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'


def test_a_retry_wait_frees_the_slot_and_the_retry_queues_behind_the_caller_who_took_it(
    server: FakeServer,
    client_kind: Kind,
) -> None:
    b_sent = threading.Event()  # B's request reached the server: B holds the slot
    b_moved = threading.Event()  # B either holds the slot or was queued
    a_queued = threading.Event()

    def answer_b(request: RecordedRequest) -> Script:
        b_sent.set()
        b_moved.set()
        if not a_queued.wait(5.0):
            raise AssertionError("A's retry never queued behind B")
        return sse_reply(ANSWER)

    server.route(*CHAT, loading(), answer_b, sse_reply(ANSWER))
    client = client_kind.client_for(server, poll_ms=200)
    a_events: list[ChatEvent] = []
    b_events: list[ChatEvent] = []
    b_outcome: list[Completion | InferError] = []

    def b_event(event: ChatEvent) -> None:
        b_events.append(event)
        if isinstance(event, Queued):
            b_moved.set()

    def run_b() -> None:
        try:
            b_outcome.append(client.chat(REQ, b_event))
        except InferError as exc:
            b_outcome.append(exc)

    b = threading.Thread(target=run_b, name="caller-b")

    def a_event(event: ChatEvent) -> None:
        a_events.append(event)
        if isinstance(event, Retrying):
            b.start()
            assert b_moved.wait(5.0), "B neither got the slot nor queued"
            assert b_sent.is_set(), f"B was queued while A only waited to retry: {b_events}"
        elif isinstance(event, Queued):
            a_queued.set()

    try:
        completion = client.chat_with_retry(REQ, a_event)
    finally:
        a_queued.set()  # never leave B's answer held, whatever failed
        if b.ident is not None:
            b.join(5.0)
            assert not b.is_alive()

    assert completion == ANSWER_COMPLETION
    assert a_events == [Retrying(2, 50, LOADING_ERROR, resend=True), Queued(1), *ANSWER_EVENTS]
    assert b_outcome == [ANSWER_COMPLETION]
    assert b_events == ANSWER_EVENTS
    a_first, b_request, a_retry = recorded(server, CHAT)
    assert a_first.body == b_request.body == a_retry.body
    assert b_request.time < a_retry.time
    gate = client._gate  # internal: a finished run leaves the slot free
    assert not gate.held(REQ.slot) and gate.waiting(REQ.slot) == 0
