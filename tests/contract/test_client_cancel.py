"""Cancel, close and the event iterator against the fake server over a real Unix socket.

A call is cancelled from another thread while it is in one phase: queued at the slot gate,
waiting for the response head (a `/slots` poll included), streaming, posting `reasoning_end`,
or waiting to retry. Each test measures from the moment `cancel()` is called to the moment the
call returns, and checks that the call's connections were closed (the server sees it) and that
the slot gate is free again. The limits a test names are 50-200 ms; "forever" is a script that
would run on for seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import End, FakeServer, Piece, RecordedRequest, Reply, Script, json_reply, silence, sse_reply
from app.calls import CLOSE_WAIT_S
from app.client import Client
from client_support import (
    ANSWER,
    ANSWER_COMPLETION,
    ANSWER_EVENTS,
    CHAT,
    CONTROL,
    REQ,
    SLOTS,
    STOP,
    Kind,
    chunk,
    recorded,
)
from domain.cancel import CancelToken
from domain.errors import Cancelled, ClientClosed, InferError
from domain.events import ChatEvent, Content, Queued, Reasoning, Retrying, Waiting

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

# The brief's promise is 100 ms from cancel to return; a loaded 2-core machine gets some slack
# in the assertion, the figure itself is reported by the note's measurements.
WITHIN_S = 0.1


class Canceller:
    """Cancels `token` from its own thread as soon as an event matching `when` is emitted, and
    records when it did."""

    def __init__(self, token: CancelToken, when: Callable[[ChatEvent], bool]) -> None:
        self.token = token
        self.when = when
        self.events: list[ChatEvent] = []
        self._go = threading.Event()
        self.cancelled_at = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def on_event(self, event: ChatEvent) -> None:
        self.events.append(event)
        if self.when(event):
            self._go.set()

    def _run(self) -> None:
        if self._go.wait(5.0):
            time.sleep(0.02)  # let the call go back to blocking in its I/O
            self.cancelled_at = time.monotonic()
            self.token.cancel()

    def join(self) -> None:
        self._thread.join(5.0)


def run_until_cancelled(call: Callable[[Callable[[ChatEvent], None]], Any], canceller: Canceller) -> float:
    """Run the call to its `Cancelled`; returns seconds from cancel to return."""
    with pytest.raises(Cancelled) as caught:
        call(canceller.on_event)
    returned = time.monotonic()
    canceller.join()
    assert type(caught.value) is Cancelled
    assert canceller.cancelled_at > 0, "the cancel fired"
    return returned - canceller.cancelled_at


def cancel_once(client: Client, reached: threading.Event) -> tuple[BaseException | None, float]:
    """Run `client.chat(REQ)` in a thread, cancel it once the server saw `reached` (the call is
    then blocked in that phase's I/O); its outcome, and seconds from cancel to return."""
    token = CancelToken()
    done = threading.Event()
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            client.chat(REQ, lambda event: None, cancel=token)
        except BaseException as exc:
            outcome.append(exc)
        done.set()

    thread = threading.Thread(target=call)
    thread.start()
    assert reached.wait(2.0)
    time.sleep(0.02)
    cancelled_at = time.monotonic()
    token.cancel()
    assert done.wait(2.0)
    latency = time.monotonic() - cancelled_at
    thread.join(2.0)
    return (outcome[0] if outcome else None), latency


@pytest.mark.parametrize("retry", [False, True], ids=["chat", "chat_with_retry"])
def test_cancel_while_streaming_returns_at_once_and_closes_the_stream(
    server: FakeServer, client_kind: Kind, retry: bool, caplog: pytest.LogCaptureFixture
) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    client = client_kind.client_for(server, liveness_ms=200)
    token = CancelToken()
    canceller = Canceller(token, lambda e: isinstance(e, Content))
    call = client.chat_with_retry if retry else client.chat

    with caplog.at_level(logging.WARNING, logger="inferpath"):
        latency = run_until_cancelled(lambda sink: call(REQ, sink, cancel=token), canceller)

    assert latency < WITHIN_S
    assert canceller.events == [Content("Paris")], "the cancel's own shutdown of the stream is no cut to retry"
    assert [r.getMessage() for r in caplog.records] == []
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0), "closing the connection is what stops the generation"
    assert not client._gate.held(0)


def test_cancel_while_waiting_for_the_head_returns_at_once(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, silence())
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True}]))
    client = client_kind.client_for(server, poll_ms=50, busy_wait_ms=200)
    token = CancelToken()
    canceller = Canceller(token, lambda e: isinstance(e, Waiting))

    latency = run_until_cancelled(lambda sink: client.chat(REQ, sink, cancel=token), canceller)

    assert latency < WITHIN_S
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0)


def test_cancel_during_a_slots_poll_returns_at_once(server: FakeServer, client_kind: Kind) -> None:
    # The probe itself is left unanswered: the cancel must cut its connection too.
    polled = threading.Event()

    def slots(request: RecordedRequest) -> Script:
        polled.set()
        return silence()

    server.route(*CHAT, silence())
    server.route(*SLOTS, slots)
    client = client_kind.client_for(server, poll_ms=50, busy_wait_ms=200, load_wait_ms=200)
    outcome, latency = cancel_once(client, polled)

    assert type(outcome) is Cancelled
    assert latency < WITHIN_S
    assert all(r.client_closed.wait(1.0) for r in server.requests)


def test_cancel_while_queued_gives_up_the_place_and_sends_nothing(server: FakeServer, client_kind: Kind) -> None:
    release = threading.Event()

    def first(request: RecordedRequest) -> Script:
        release.wait(5.0)
        return sse_reply(ANSWER)

    server.route(*CHAT, first)
    client = client_kind.client_for(server, liveness_ms=200, poll_ms=200)
    holder = threading.Thread(target=lambda: client.chat(REQ, lambda event: None))
    holder.start()
    deadline = time.monotonic() + 2.0
    while not client._gate.held(0) and time.monotonic() < deadline:
        time.sleep(0.005)
    token = CancelToken()
    canceller = Canceller(token, lambda e: isinstance(e, Queued))

    latency = run_until_cancelled(lambda sink: client.chat(REQ, sink, cancel=token), canceller)
    release.set()
    holder.join(5.0)

    assert latency < WITHIN_S
    assert canceller.events == [Queued(1)]
    assert len(recorded(server, CHAT)) == 1, "the cancelled request was never sent"
    assert client._gate.waiting(0) == 0


def test_cancel_while_posting_reasoning_end_returns_at_once(server: FakeServer, client_kind: Kind) -> None:
    server.route(
        *CHAT,
        sse_reply([chunk({"reasoning_content": f" t{n}"}, n=n) for n in range(1, 12)], done=False, end=End.SILENCE),
    )
    posted = threading.Event()

    def control(request: RecordedRequest) -> Script:
        posted.set()
        return silence()

    server.route(*CONTROL, control)
    client = client_kind.client_for(server, thinking_cap=8, thinking_overrun=4, liveness_ms=200)
    outcome, latency = cancel_once(client, posted)

    assert type(outcome) is Cancelled
    assert latency < WITHIN_S
    (control_call,) = recorded(server, CONTROL)
    assert control_call.client_closed.wait(1.0)
    assert recorded(server, CHAT)[0].client_closed.wait(1.0)


def test_cancel_while_waiting_to_retry_makes_no_later_attempt(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, json_reply({"error": {"code": 503, "message": "Loading model"}}, 503))
    client = client_kind.client_for(server, retry={"attempts": 2, "delays_ms": [200]})
    token = CancelToken()
    canceller = Canceller(token, lambda e: isinstance(e, Retrying))

    latency = run_until_cancelled(lambda sink: client.chat_with_retry(REQ, sink, cancel=token), canceller)

    assert latency < WITHIN_S
    assert len(recorded(server, CHAT)) == 1


def test_a_token_cancelled_before_the_call_sends_nothing(server: FakeServer, client_kind: Kind) -> None:
    token = CancelToken()
    token.cancel()

    with pytest.raises(Cancelled):
        client_kind.client_for(server).chat(REQ, lambda event: None, cancel=token)

    assert server.requests == []


@pytest.mark.sync_only("builds no client")
def test_cancel_is_idempotent_and_a_token_says_so() -> None:
    token = CancelToken()
    assert not token.cancelled
    token.cancel()
    token.cancel()
    assert token.cancelled


# -- close ------------------------------------------------------------------------------------


def test_close_ends_calls_in_flight_and_queued_and_refuses_new_ones(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    client = client_kind.client_for(server, liveness_ms=200, poll_ms=200)
    outcomes: list[BaseException | None] = [None, None]
    streaming = threading.Event()

    def first() -> None:
        try:
            client.chat(REQ, lambda e: streaming.set() if isinstance(e, Content) else None)
        except BaseException as exc:
            outcomes[0] = exc

    def second() -> None:
        try:
            client.chat(REQ, lambda event: None)
        except BaseException as exc:
            outcomes[1] = exc

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert streaming.wait(2.0)
    threads[1].start()
    deadline = time.monotonic() + 2.0
    while client._gate.waiting(0) == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    started = time.monotonic()
    client.close()
    closed_in = time.monotonic() - started
    for thread in threads:
        thread.join(2.0)
    requests_before = len(server.requests)

    assert closed_in < 0.3
    assert all(isinstance(o, ClientClosed) for o in outcomes), outcomes
    with pytest.raises(ClientClosed):
        client.chat(REQ, lambda event: None)
    with pytest.raises(ClientClosed):
        client.chat_with_retry(REQ, lambda event: None)
    assert len(server.requests) == requests_before, "a closed client touches no server"
    assert recorded(server, CHAT)[0].client_closed.wait(1.0)


def test_a_client_used_as_a_context_manager_is_closed_after_it(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    with client_kind.client_for(server) as client:
        assert client.chat(REQ, lambda event: None) == ANSWER_COMPLETION

    with pytest.raises(ClientClosed):
        client.chat(REQ, lambda event: None)


def test_close_in_the_consumers_own_thread_waits_at_most_close_wait_s_then_the_next_step_raises_client_closed(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    client = client_kind.client_for(server, liveness_ms=2000)

    with client.stream(REQ) as s:
        events = iter(s)
        assert next(events) == Content("Paris")
        started = time.monotonic()
        client.close()  # in the thread that holds the stream between two events: its next step ends it
        waited = time.monotonic() - started
        (stream,) = recorded(server, CHAT)
        assert stream.client_closed.wait(1.0), "its connection is shut at once all the same"
        with pytest.raises(ClientClosed):
            next(events)

    assert CLOSE_WAIT_S - 0.02 <= waited < CLOSE_WAIT_S + WITHIN_S
    assert not client._gate.held(0)


@pytest.mark.sync_only("builds no client")
def test_closed_errors_are_cancelled_and_infer_errors() -> None:
    assert issubclass(ClientClosed, Cancelled)
    assert issubclass(Cancelled, InferError)


# -- the iterator -----------------------------------------------------------------------------


def test_a_stream_iterates_the_events_then_has_the_completion(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)

    with client.stream(REQ) as s:
        events = list(s)

    assert events == ANSWER_EVENTS
    assert s.completion == ANSWER_COMPLETION
    assert not client._gate.held(0)


def test_leaving_the_loop_early_closes_the_connection_at_once(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    client = client_kind.client_for(server, liveness_ms=200)

    with client.stream(REQ) as s:
        for event in s:
            assert event == Content("Paris")
            break
        left = time.monotonic()
        (stream,) = recorded(server, CHAT)
        assert stream.client_closed.wait(1.0)
        assert time.monotonic() - left < 0.5
        assert not client._gate.held(0), "the slot is free as soon as the loop is left"

    with pytest.raises(RuntimeError, match="no completion"):
        s.completion  # noqa: B018


def test_an_exception_inside_the_with_block_closes_the_connection(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    client = client_kind.client_for(server, liveness_ms=200)

    with pytest.raises(KeyError), client.stream(REQ) as s:
        next(iter(s))
        raise KeyError("the caller's own failure")

    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(1.0)
    assert not client._gate.held(0)


def test_a_stream_raises_the_calls_error_from_the_loop(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply([chunk({"reasoning_content": "x"}, n=1)], done=False, end=End.SILENCE))
    client = client_kind.client_for(server, timed=True)
    seen: list[ChatEvent] = []

    with pytest.raises(InferError, match="liveness limit"), client.stream(REQ) as s:
        seen.extend(s)

    # The stall is one re-attach (refused by this server: no replay), then the error.
    reasoning, retrying = seen
    assert reasoning == Reasoning("x")
    assert isinstance(retrying, Retrying) and (retrying.attempt, retrying.after_ms) == (2, 50)
    assert retrying.error.startswith("Stalled: no data for")
    assert len(recorded(server, ("GET", "/v1/stream"))) == 1


def test_a_stream_closed_before_its_first_event_sends_nothing_and_a_loop_after_raises(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)

    with client.stream(REQ) as s:
        s.close()
        with pytest.raises(Cancelled, match="closed before it was read to its end"):
            list(s)

    assert server.requests == []
    with pytest.raises(RuntimeError, match="no completion"):
        s.completion  # noqa: B018


def test_a_stream_closed_from_another_thread_before_its_first_event_raises_in_a_loop_after(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    s = client_kind.client_for(server).stream(REQ)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(2.0)

    with pytest.raises(Cancelled, match="closed before it was read to its end"):
        list(s)
    assert server.requests == []


def test_stream_with_retry_retries_like_chat_with_retry(server: FakeServer, client_kind: Kind) -> None:
    answers = iter([json_reply({"error": {"code": 503, "message": "Loading model"}}, 503), sse_reply(ANSWER)])
    server.route(*CHAT, lambda request: next(answers))
    client: Client = client_kind.client_for(server)

    with client.stream_with_retry(REQ) as s:
        events = list(s)

    assert [type(e) for e in events] == [Retrying, *(type(e) for e in ANSWER_EVENTS)]
    assert s.completion == ANSWER_COMPLETION
    assert len(recorded(server, CHAT)) == 2


def test_a_stop_takes_at_most_its_wait_in_all_its_answers_body_unread(server: FakeServer, client_kind: Kind) -> None:
    # The DELETE's head comes after 150 ms, then its body drips for seconds: the stop is done at
    # the head, 250 ms in all at most (it used to wait as long again for the body).
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    dripping = [Piece(0.05, b"x") for _ in range(60)]
    server.route(*STOP, Reply(200, (("Content-Length", "60"),), dripping, head_delay_s=0.15))
    token = CancelToken()
    cancelled_at: list[float] = []

    def on_event(event: ChatEvent) -> None:
        if isinstance(event, Content):
            cancelled_at.append(time.monotonic())
            token.cancel()

    with pytest.raises(Cancelled):
        client_kind.client_for(server, liveness_ms=2000).chat(REQ, on_event, cancel=token)
    took = time.monotonic() - cancelled_at[0]

    assert 0.15 <= took < 0.25, f"{took * 1000:.0f} ms"
    assert len(recorded(server, STOP)) == 1
