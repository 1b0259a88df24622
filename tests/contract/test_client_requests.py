"""One request from gate to completion against the fake server: HTTP errors, retries, the
thinking cap, the slot gate, the size caps, slot validation and recorded transcripts.

Limits are set between 50 and 200 ms through `Config`; retry waits are 50, 80 and 120 ms without
jitter unless a test says otherwise. Where time must pass without a socket (the socket missing),
the container's clock is a `FakeClock`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from adapters.fake_server import (
    End,
    FakeClock,
    FakeServer,
    Piece,
    RecordedRequest,
    Reply,
    Script,
    error_reply,
    json_reply,
    loading,
    raw_reply,
    silence,
    slots_reply,
    sse_reply,
)
from app.client import Client
from app.config import parse_config
from app.container import Container
from client_support import (
    ANSWER,
    ANSWER_COMPLETION,
    ANSWER_EVENTS,
    CHAT,
    CID,
    CONTROL,
    EXPECT,
    PROPS,
    REQ,
    ROLE,
    SLOTS,
    Kind,
    chunk,
    config_for,
    overridden,
    recorded,
)
from domain.completion import Completion, FinishReason, Timings
from domain.errors import (
    Busy,
    ConnectError,
    HttpError,
    InferError,
    ProtocolError,
    StreamClosedEarly,
    ThinkingOverrun,
    WaitTimeout,
)
from domain.events import ChatEvent, Content, Progress, Queued, Reasoning, Retrying, ThinkingCapped, ToolCallDelta
from domain.messages import ChatRequest, ToolCall, ToolSchema
from domain.request import RequestError
from domain.thinking import END_TAG_TOKENS
from transcripts import MISSING, TRANSCRIPTS, Case, case_names, case_params, load_case, request_from

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

TOO_LONG = error_reply(
    400,
    "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",
    "exceed_context_size_error",
)
TOO_LONG_BODY = (
    '{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), '
    'try increasing it","type":"exceed_context_size_error"}}'
)


# -- HTTP errors and retries ----------------------------------------------------------------------


def test_http_400_is_returned_at_once_with_its_body_unchanged_and_not_retried(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, TOO_LONG)
    events: list[ChatEvent] = []

    with pytest.raises(HttpError) as caught:
        client_kind.client_for(server).chat_with_retry(REQ, events.append)

    assert (caught.value.status, caught.value.body) == (400, TOO_LONG_BODY)
    assert events == []
    assert len(server.requests) == 1


def test_an_error_body_is_kept_up_to_4_kib_and_cut_there(server: FakeServer, client_kind: Kind) -> None:
    body = ("é" * 3000).encode()  # 6000 bytes; the cut falls inside a character
    # The router's proxy failure is a 500 with a plain-text body.
    server.route(*CHAT, Reply(500, (("Content-Type", "text/plain"),), [Piece(0.0, body)]))

    with pytest.raises(HttpError) as caught:
        client_kind.client_for(server).chat(REQ, lambda event: None)

    assert caught.value.status == 500
    assert caught.value.body == body[:4096].decode("utf-8", "replace")
    assert caught.value.body.encode()[:4094] == body[:4094]


def test_http_503_then_success_emits_one_retrying_then_the_completion(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, loading(), sse_reply(ANSWER))
    client = client_kind.client_for(server)
    events: list[ChatEvent] = []

    completion = client.chat_with_retry(REQ, events.append)

    assert completion == ANSWER_COMPLETION
    retry = Retrying(
        attempt=2,
        after_ms=50,
        error='HttpError: HTTP 503: {"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}',
        resend=True,
    )
    assert events == [retry, *ANSWER_EVENTS]
    first, second = recorded(server, CHAT)
    assert second.time - first.time >= 0.05
    # Nothing is recorded before a completion is final, so a retry sends the very same bytes.
    assert first.body == second.body == client.render(REQ)


def test_a_cut_stream_is_retried_with_a_byte_identical_body(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER[:2], done=False, end=End.RESET), sse_reply(ANSWER))
    client = client_kind.client_for(server)
    events: list[ChatEvent] = []

    completion = client.chat_with_retry(REQ, events.append)

    assert completion == ANSWER_COMPLETION
    assert events[:2] == ANSWER_EVENTS[:2]
    retry, resent = events[2:4]
    assert isinstance(retry, Retrying) and isinstance(resent, Retrying)
    assert (retry.attempt, retry.after_ms, retry.resend) == (2, 50, False)  # a re-attach first
    assert retry.error.startswith("StreamClosedEarly: POST /v1/chat/completions: connection closed")
    # Refused: the request again at once, and the events from the start, said by the re-send.
    assert (resent.attempt, resent.after_ms, resent.resend) == (2, 0, True)
    assert events[4:] == ANSWER_EVENTS
    first, second = recorded(server, CHAT)
    assert first.body == second.body
    # The same request under a new conversation id: this server refused the re-attach (no replay).
    conversation = "x-conversation-id"
    assert [h for h in first.headers if h[0] != conversation] == [h for h in second.headers if h[0] != conversation]
    assert first.header(conversation) != second.header(conversation)
    (reattach,) = recorded(server, ("GET", "/v1/stream"))
    assert reattach.target.startswith(f"/v1/stream?conv_id={first.header(conversation)}&from=")


def test_a_stalled_stream_is_retried(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER[:2], done=False, end=End.SILENCE), sse_reply(ANSWER))
    events: list[ChatEvent] = []

    assert client_kind.client_for(server, timed=True).chat_with_retry(REQ, events.append) == ANSWER_COMPLETION

    names = ["Progress", "Content", "Retrying", "Retrying", "Progress", "Content", "Content"]
    assert [type(e).__name__ for e in events] == names
    assert isinstance(events[2], Retrying) and events[2].error.startswith("Stalled: no data for")
    assert isinstance(events[3], Retrying) and events[3].resend, "the re-send that follows the refused re-attach"
    first, second = recorded(server, CHAT)
    assert first.client_closed.wait(2.0), "the stalled connection is closed before the retry"
    assert first.closed_at is not None and first.closed_at <= second.time


def test_wait_timeout_has_already_waited_and_is_not_retried(server: FakeServer, client_kind: Kind) -> None:
    server.route(*SLOTS, slots_reply([True, False]))
    server.route(*CHAT, silence())
    events: list[ChatEvent] = []

    with pytest.raises(WaitTimeout):
        client_kind.client_for(server, timed=True).chat_with_retry(REQ, events.append)

    assert all(not isinstance(e, Retrying) for e in events)
    assert len(recorded(server, CHAT)) == 1


@pytest.mark.parametrize("how", ["fake clock", "real clock"])
def test_a_missing_socket_is_connect_error_after_4_attempts_with_the_right_waits(
    tmp_path: Any, how: str, client_kind: Kind
) -> None:
    clock = FakeClock()
    events: list[ChatEvent] = []
    started = time.monotonic()

    with overridden() as make, pytest.raises(ConnectError, match="no such socket file"):
        overrides = {"clock": clock} if how == "fake clock" else {}
        client_kind.client_of(make(config_for(str(tmp_path / "missing.sock")), **overrides)).chat_with_retry(
            REQ, events.append
        )

    assert [(e.attempt, e.after_ms) for e in events if isinstance(e, Retrying)] == [(2, 50), (3, 80), (4, 120)]
    assert len(events) == 3
    assert all(isinstance(e, Retrying) and e.error.startswith("ConnectError: cannot connect to") for e in events)
    if how == "fake clock":
        assert clock.now() == pytest.approx(0.25)
    else:
        assert 0.25 <= time.monotonic() - started < 2.0


def test_retries_never_wait_past_the_total_budget(tmp_path: Any, client_kind: Kind) -> None:
    config = config_for(str(tmp_path / "missing.sock"), retry={"total_ms": 200})
    clock = FakeClock()
    events: list[ChatEvent] = []

    with overridden() as make, pytest.raises(ConnectError):
        client_kind.client_of(make(config, clock=clock)).chat_with_retry(REQ, events.append)

    # 50 + 80 = 130 ms waited; a third wait of 120 ms would end at 250 ms, past the 200 ms budget.
    assert [(e.attempt, e.after_ms) for e in events if isinstance(e, Retrying)] == [(2, 50), (3, 80)]
    assert clock.now() == pytest.approx(0.13)


def test_retry_waits_are_jittered_within_a_quarter_of_the_delay(tmp_path: Any, client_kind: Kind) -> None:
    config = config_for(str(tmp_path / "missing.sock"), retry={"jitter": 0.25, "delays_ms": [100, 200, 400]})
    for seed in range(20):
        clock = FakeClock()
        events: list[ChatEvent] = []
        with overridden() as make, pytest.raises(ConnectError):
            client_kind.client_of(make(config, clock=clock, rng=random.Random(seed))).chat_with_retry(
                REQ, events.append
            )
        waits = [e.after_ms for e in events if isinstance(e, Retrying)]
        assert len(waits) == 3
        for wait, delay in zip(waits, (100, 200, 400), strict=True):
            assert 0.75 * delay <= wait <= 1.25 * delay
        assert clock.now() * 1000 == pytest.approx(sum(waits)) and sum(waits) < 1000


def test_a_server_loading_when_the_slot_count_is_first_asked_is_retried(server: FakeServer, client_kind: Kind) -> None:
    # Without [expect] the client learns the slot count from /props on its first request.
    server.route(*PROPS, loading(), json_reply(props_answer()))
    server.route(*CHAT, sse_reply(ANSWER))
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server, expect=False).chat_with_retry(REQ, events.append)

    assert completion == ANSWER_COMPLETION
    assert [type(e).__name__ for e in events] == ["Retrying", "Progress", "Content", "Content"]
    assert [r.path for r in server.requests] == ["/props", "/props", "/v1/chat/completions"]


def test_a_whole_json_answer_to_a_stream_request_is_a_protocol_error_not_retried(
    server: FakeServer, client_kind: Kind
) -> None:
    # A server that ignored `stream: true`: without this check it would read as a stream with no
    # final chunk and be retried.
    answer = {"choices": [{"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "Hi"}}]}
    server.route(*CHAT, json_reply(answer))

    with pytest.raises(ProtocolError, match="not an event stream"):
        client_kind.client_for(server).chat_with_retry(REQ, lambda event: None)

    (request,) = recorded(server, CHAT)
    assert [r.target for r in recorded(server, ("DELETE", "/v1/stream"))] == [
        f"/v1/stream?conv_id={request.header('x-conversation-id')}"
    ]


# -- slot ids ---------------------------------------------------------------------------------------


def props_answer(total_slots: int = 2) -> dict[str, Any]:
    return {
        "chat_template": "{{ messages }}",
        "total_slots": total_slots,
        "default_generation_settings": {"n_ctx": 4096},
        "model_alias": "test-model",
        "model_path": "/models/test.gguf",
    }


@pytest.mark.parametrize("slot", [2, 7])
def test_a_slot_outside_total_slots_is_refused_before_anything_is_sent(
    server: FakeServer, slot: int, client_kind: Kind
) -> None:
    # llama-server would wrap the id modulo its slot count and run the request on another slot.
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)
    events: list[ChatEvent] = []

    with pytest.raises(RequestError, match=f"slot {slot} is outside the server's 2 slots"):
        client.chat(ChatRequest(slot=slot, messages=REQ.messages), events.append)
    with pytest.raises(RequestError):
        client.chat_with_retry(ChatRequest(slot=slot, messages=REQ.messages), events.append)

    assert events == []
    assert server.requests == []


def test_without_expect_the_slot_count_comes_from_props_once(server: FakeServer, client_kind: Kind) -> None:
    server.route(*PROPS, json_reply(props_answer(total_slots=3)))
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server, expect=False)

    with pytest.raises(RequestError, match="slot 3 is outside the server's 3 slots"):
        client.chat(ChatRequest(slot=3, messages=REQ.messages), lambda event: None)
    assert client.chat(ChatRequest(slot=2, messages=REQ.messages), lambda event: None) == ANSWER_COMPLETION

    assert [r.path for r in server.requests] == ["/props", "/v1/chat/completions"]
    assert server.requests[1].json()["id_slot"] == 2


def test_the_request_carries_what_the_brief_lists(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_for(server)
    client.chat(ChatRequest(slot=1, messages=REQ.messages, thinking=True), lambda event: None)

    (request,) = server.requests
    assert request.header("content-type") == "application/json"
    assert request.header("connection") == "close"
    body = request.json()
    assert {
        k: body[k]
        for k in (
            "model",
            "id_slot",
            "cache_prompt",
            "stream",
            "return_progress",
            "timings_per_token",
            "reasoning_control",
            "max_tokens",
        )
    } == {
        "model": "default",
        "id_slot": 1,
        "cache_prompt": True,
        "stream": True,
        "return_progress": True,
        "timings_per_token": True,
        "reasoning_control": True,
        "max_tokens": 8192,
    }
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["messages"] == [{"role": "user", "content": "What is the capital of France?"}]


# -- size caps --------------------------------------------------------------------------------------


def test_an_sse_line_over_its_cap_is_a_protocol_error(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply([ANSWER[1], chunk({"content": "x" * 5000}, n=2), *ANSWER[2:]]))
    events: list[ChatEvent] = []

    with pytest.raises(ProtocolError, match="over 4096 bytes"):
        client_kind.client_for(server, sse_line_bytes=4096).chat(REQ, events.append)

    assert events == [Content("Paris")]
    (request,) = recorded(server, CHAT)
    assert request.client_closed.wait(2.0)


def test_a_response_head_over_its_cap_is_a_protocol_error(server: FakeServer, client_kind: Kind) -> None:
    headers = (("Content-Type", "text/event-stream"), ("X-Padding", "p" * 2000))
    server.route(*CHAT, sse_reply(ANSWER, headers=headers))

    with pytest.raises(ProtocolError, match="1024-byte limit"):
        client_kind.client_for(server, header_bytes=1024).chat(REQ, lambda event: None)


# -- the thinking cap -------------------------------------------------------------------------------


def reasoning(first: int, last: int) -> list[dict[str, Any]]:
    return [chunk({"reasoning_content": f" t{n}"}, n=n) for n in range(first, last + 1)]


def control_route(server: FakeServer, events: list[ChatEvent], answer: Script) -> list[int]:
    """Route the control call to `answer`; returns the list of Reasoning counts seen at each call
    (the client waits for the answer, so its events stand still while the handler runs)."""
    seen: list[int] = []

    def handler(request: RecordedRequest) -> Script:
        seen.append(sum(isinstance(e, Reasoning) for e in events))
        return answer

    server.route(*CONTROL, handler)
    return seen


def test_runaway_thinking_is_capped_once_with_the_stream_id_and_completes(
    server: FakeServer, client_kind: Kind
) -> None:
    # Cap 8, overrun 4: two more reasoning tokens after reasoning_end, then the answer.
    stream = [
        chunk(ROLE, n=0, progress=(42, 0, 42)),
        *reasoning(1, 10),
        chunk({"content": "Done."}, n=11),
        chunk(finish="stop", n=11),
    ]
    server.route(*CHAT, sse_reply(stream))
    events: list[ChatEvent] = []
    seen = control_route(server, events, json_reply({"success": True}))

    completion = client_kind.client_for(server, thinking_cap=8, thinking_overrun=4).chat(REQ, events.append)

    assert events == [
        Progress(42, 0, 42),
        *(Reasoning(f" t{n}") for n in range(1, 9)),
        ThinkingCapped(tokens=8),
        *(Reasoning(f" t{n}") for n in range(9, 11)),
        Content("Done."),
    ]
    assert seen == [8], "posted once, right after the chunk that reached the cap"
    (control,) = recorded(server, CONTROL)
    assert control.json() == {"id": CID, "action": "reasoning_end", "model": "default"}
    assert completion == Completion(
        id=CID,
        content="Done.",
        reasoning_content="".join(f" t{n}" for n in range(1, 11)),
        tool_calls=(),
        finish_reason=FinishReason.STOP,
        timings=Timings(0, 42, 11),
        reasoning_tokens=10,
        thinking_capped=True,
    )


def test_reasoning_past_the_overrun_is_thinking_overrun_and_the_connection_is_closed(
    server: FakeServer, client_kind: Kind
) -> None:
    # The server keeps thinking and then holds the connection open: only the client can close it.
    server.route(*CHAT, sse_reply(reasoning(1, 30), done=False, end=End.SILENCE))
    events: list[ChatEvent] = []
    control_route(server, events, json_reply({"success": True}))

    with pytest.raises(ThinkingOverrun, match="reasoning went on to 13 tokens after reasoning_end was posted at 8"):
        client_kind.client_for(server, thinking_cap=8, thinking_overrun=4).chat_with_retry(REQ, events.append)

    assert events == [
        *(Reasoning(f" t{n}") for n in range(1, 9)),
        ThinkingCapped(8),
        *(Reasoning(f" t{n}") for n in range(9, 14)),
    ]
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(2.0), "closing the connection is what cancels the generation"
    assert len(recorded(server, CONTROL)) == 1


@pytest.mark.parametrize(
    "answer",
    [
        json_reply({"success": False, "message": "no active completion for this id"}),
        json_reply({"success": False, "message": "reasoning control not enabled for this completion"}),
        error_reply(400, "unknown action", "invalid_request_error"),
        json_reply({"ok": True}),
    ],
    ids=["no-active-completion", "not-enabled", "http-400", "no-success-field"],
)
def test_a_control_call_without_success_true_is_thinking_overrun(
    server: FakeServer, answer: Reply, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(reasoning(1, 30), done=False, end=End.SILENCE))
    events: list[ChatEvent] = []
    control_route(server, events, answer)

    with pytest.raises(ThinkingOverrun, match="reasoning_end posted at 8 reasoning tokens was not accepted"):
        client_kind.client_for(server, thinking_cap=8, thinking_overrun=4).chat(REQ, events.append)

    assert events == [Reasoning(f" t{n}") for n in range(1, 9)]
    (stream,) = recorded(server, CHAT)
    assert stream.client_closed.wait(2.0)


def test_a_control_call_left_unanswered_is_thinking_overrun_within_the_liveness_limit(
    server: FakeServer, client_kind: Kind
) -> None:
    # The stream is not read while the client waits for the control call, so it waits no longer
    # than liveness_ms (100 ms here), not a load wait.
    server.route(*CHAT, sse_reply(reasoning(1, 30), done=False, end=End.SILENCE))
    server.route(*CONTROL, silence())
    events: list[ChatEvent] = []
    started = time.monotonic()

    with pytest.raises(ThinkingOverrun, match="not accepted: Stalled: POST /v1/chat/completions/control"):
        client_kind.client_for(server, timed=True, thinking_cap=8, thinking_overrun=4, load_wait_ms=200).chat(
            REQ, events.append
        )

    assert time.monotonic() - started < 2.0
    assert events == [Reasoning(f" t{n}") for n in range(1, 9)]
    (control,) = recorded(server, CONTROL)
    assert control.client_closed.wait(2.0)


def test_reasoning_under_the_cap_posts_no_control_call(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply([*reasoning(1, 7), chunk({"content": "ok"}, n=8), chunk(finish="stop", n=8)]))

    completion = client_kind.client_for(server, thinking_cap=8).chat(REQ, lambda event: None)

    assert (completion.reasoning_tokens, completion.thinking_capped) == (7, False)
    assert recorded(server, CONTROL) == []


# -- the slot gate ------------------------------------------------------------------------------


class Callers:
    """Threads calling `client.chat` on one slot, each with its own event log, and the signals
    the test steers them with: no sleeps, only events."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.cond = threading.Condition()
        self.logs: dict[int, list[ChatEvent]] = {}
        self.outcomes: dict[int, Completion | InferError] = {}
        self.threads: list[threading.Thread] = []
        self.release_first = threading.Event()
        self.first_in_flight = threading.Event()
        self.last = 0

    def seen(self, caller: int, event: ChatEvent) -> bool:
        with self.cond:
            return event in self.logs[caller]

    def wait_for(self, predicate: Callable[[], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, 5.0), "a caller never got where the test expected"

    def on_event(self, caller: int) -> Callable[[ChatEvent], None]:
        started = False

        def sink(event: ChatEvent) -> None:
            nonlocal started
            with self.cond:
                self.logs[caller].append(event)
                self.cond.notify_all()
            if isinstance(event, Queued) or started:
                return
            started = True  # this caller holds the slot now
            if caller == 1:
                self.first_in_flight.set()
                assert self.release_first.wait(5.0)
            else:
                # Hold the slot until every caller behind has seen its place move up by one.
                later = range(caller + 1, self.last + 1)
                self.wait_for(lambda: all(Queued(j - caller) in self.logs[j] for j in later))

        return sink

    def start(self, caller: int) -> None:
        self.logs[caller] = []
        self.last = caller

        def run() -> None:
            try:
                self.outcomes[caller] = self.client.chat(REQ, self.on_event(caller))
            except InferError as exc:
                self.outcomes[caller] = exc

        thread = threading.Thread(target=run, name=f"caller-{caller}")
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(5.0)
            assert not thread.is_alive()


def test_one_in_flight_and_8_queued_then_busy_at_once_and_queued_counts_down(
    server: FakeServer, client_kind: Kind
) -> None:
    # The first request fails (cut mid-stream); the eight behind it then run one by one.
    server.route(*CHAT, sse_reply(ANSWER[:2], done=False, end=End.RESET), sse_reply(ANSWER))
    client = client_kind.client_for(server, liveness_ms=200, busy_wait_ms=5000)  # queued for as long as it takes
    callers = Callers(client)

    callers.start(1)
    assert callers.first_in_flight.wait(5.0)
    for caller in range(2, 10):
        callers.start(caller)
        callers.wait_for(lambda caller=caller: Queued(caller - 1) in callers.logs[caller])

    tenth: list[ChatEvent] = []
    started = time.monotonic()
    with pytest.raises(Busy, match="slot 0 is busy: 8 requests already queued"):
        client.chat(REQ, tenth.append)
    with pytest.raises(Busy):
        client.chat_with_retry(REQ, tenth.append)
    assert time.monotonic() - started < 0.5
    assert tenth == []
    assert len(server.requests) == 1, "the refused callers sent nothing"

    callers.release_first.set()
    callers.join()

    assert isinstance(callers.outcomes[1], StreamClosedEarly)
    # The cut is one re-attach, made with the slot held (refused by this server), then the error.
    *answered, retrying = callers.logs[1]
    assert answered == ANSWER_EVENTS[:2]
    assert isinstance(retrying, Retrying) and (retrying.attempt, retrying.after_ms) == (2, 50)
    assert retrying.error.startswith("StreamClosedEarly: ")
    (reattach,) = recorded(server, ("GET", "/v1/stream"))
    assert reattach.time < recorded(server, CHAT)[1].time, "no caller behind got the slot before it"
    for caller in range(2, 10):
        countdown = [Queued(ahead) for ahead in range(caller - 1, 0, -1)]
        assert callers.logs[caller] == [*countdown, *ANSWER_EVENTS], f"caller {caller}"
        assert callers.outcomes[caller] == ANSWER_COMPLETION
    assert len(recorded(server, CHAT)) == 9
    assert not client_gate_held(client)


def client_gate_held(client: Client) -> bool:
    gate = client._gate  # the gate is internal; a finished run must leave it free
    return gate.held(0) or gate.waiting(0) > 0


def test_a_request_that_fails_releases_the_gate_for_the_next(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, TOO_LONG, sse_reply(ANSWER))
    client = client_kind.client_for(server)

    with pytest.raises(HttpError):
        client.chat(REQ, lambda event: None)
    assert client.chat(REQ, lambda event: None) == ANSWER_COMPLETION
    assert not client_gate_held(client)


# -- streamed tool calls and recorded transcripts -----------------------------------------------------

CALL_ID = "Xq3CwQp1Hc7oZ9vY2mLr8TnB5sKe4Ufa"
TOOL_STREAM = [
    chunk(ROLE, n=0, progress=(180, 0, 180)),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": CALL_ID,
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"city":'},
                }
            ]
        },
        n=9,
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"'}}]}, n=11),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, n=12),
    chunk(finish="tool_calls", n=13),
]


def test_a_streamed_tool_call_assembles_into_the_completion(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(TOOL_STREAM))
    events: list[ChatEvent] = []
    tools = (ToolSchema("get_time", "The time in a city.", {"type": "object", "properties": {"city": {}}}),)

    completion = client_kind.client_for(server).chat(
        ChatRequest(slot=0, messages=REQ.messages, tools=tools), events.append
    )

    assert events == [
        Progress(180, 0, 180),
        ToolCallDelta(0, CALL_ID, "get_time", '{"city":'),
        ToolCallDelta(0, None, None, ' "Paris"'),
        ToolCallDelta(0, None, None, "}"),
    ]
    assert completion == Completion(
        id=CID,
        content=None,
        reasoning_content=None,
        tool_calls=(ToolCall(CALL_ID, "get_time", '{"city": "Paris"}'),),
        finish_reason=FinishReason.TOOL_CALLS,
        timings=Timings(0, 42, 13),
    )


def _replayable(case: Case) -> bool:
    stream = case.status == 200 and "text/event-stream" in (case.response.header("Content-Type") or "")
    twin = case.inputs is not None and case.nonstream is not None and "control_request.json" not in case.files
    return stream and twin


REPLAY_CASES = case_params(_replayable, none_reason="no replayable stream")


def _replay(kind: Kind, case: Case, socket_path: str, **limits: int) -> tuple[Client, ChatRequest]:
    """The client configured as the recorder's request was, and the request from `inputs.json`."""
    inputs = case.inputs
    assert inputs is not None
    config = parse_config(
        {
            "socket": socket_path,
            "model": inputs["model"],
            "limits": {"max_tokens": inputs["max_tokens"], "liveness_ms": 200, **limits},
            "sampling": inputs["sampling"],
            "expect": EXPECT,
        }
    )
    req, _ = request_from(inputs)
    return kind.client_of(Container(config=config)), req


def _expected_completion(case: Case) -> Completion:
    """The non-stream answer as a `Completion`. The ids are random per request, so they are the
    stream's; `reasoning_tokens` is the count the stream's timings gave its last reasoning chunk."""
    choice = case.nonstream["choices"][0]
    message = choice["message"]
    chunks = case.events()
    streamed_ids = [
        call["id"]
        for c in chunks
        for d in [c["choices"][0]["delta"] if c.get("choices") else {}]
        for call in d.get("tool_calls") or []
        if call.get("id")
    ]
    reasoning_n = [
        c["timings"]["predicted_n"]
        for c in chunks
        if c.get("choices") and c["choices"][0]["delta"].get("reasoning_content")
    ]
    timings = case.nonstream["timings"]
    return Completion(
        id=chunks[0]["id"],
        content=message.get("content") or None,
        reasoning_content=message.get("reasoning_content") or None,
        tool_calls=tuple(
            ToolCall(call_id, call["function"]["name"], call["function"]["arguments"])
            for call_id, call in zip(streamed_ids, message.get("tool_calls") or [], strict=True)
        ),
        finish_reason=FinishReason(choice["finish_reason"]),
        timings=Timings(timings["cache_n"], timings["prompt_n"], timings["predicted_n"]),
        reasoning_tokens=reasoning_n[-1] if reasoning_n else 0,
        thinking_capped=False,
    )


@pytest.mark.parametrize("name", REPLAY_CASES)
@pytest.mark.parametrize("pieces", ["as recorded", "in 7-byte pieces"])
def test_a_recorded_stream_replayed_completes_to_the_servers_non_stream_answer(
    name: str, pieces: str, client_kind: Kind
) -> None:
    case = load_case(name)
    reply = raw_reply(case.response_raw, piece_bytes=7 if pieces == "in 7-byte pieces" else None)
    with FakeServer({CHAT: reply}) as server:
        client, req = _replay(client_kind, case, server.socket_path)
        events: list[ChatEvent] = []
        completion = client.chat(req, events.append)
        sent = server.requests[0].body

    assert completion == _expected_completion(case)
    assert "".join(e.text for e in events if isinstance(e, Content)) == (completion.content or "")
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == (completion.reasoning_content or "")
    assert orjson.loads(sent)["messages"] == orjson.loads(case.request)["messages"]


def test_the_recorded_forced_end_to_reasoning_replays_with_the_same_control_call(client_kind: Kind) -> None:
    """The recorder posted reasoning_end once `predicted_n` reached a mark; a client capped there
    posts the same call after the same chunk and completes with `thinking_capped`."""
    if not (TRANSCRIPTS / "index.json").exists() or "reasoning_end" not in case_names():
        pytest.skip(MISSING)
    case = load_case("reasoning_end")
    mark = case.meta["control_at_predicted_n"]
    with FakeServer(
        {CHAT: raw_reply(case.response_raw), CONTROL: raw_reply(case.files["control_response.raw"])}
    ) as server:
        # The request now carries the server's thinking budget (the cap), so the control call is
        # the fallback for a server that ignored it, posted END_TAG_TOKENS past the cap: a cap
        # that far below the recorder's mark posts the same call after the same chunk.
        client, req = _replay(client_kind, case, server.socket_path, thinking_cap=mark - END_TAG_TOKENS)
        events: list[ChatEvent] = []
        completion = client.chat(req, events.append)
        (posted,) = recorded(server, CONTROL)

    chunks = case.events()
    reasoning_chunks = [c for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("reasoning_content")]
    at_mark = next(c for c in reasoning_chunks if c["timings"]["predicted_n"] >= mark)
    recorded_call = orjson.loads(case.files["control_request.json"])
    assert {k: v for k, v in posted.json().items() if k != "model"} == recorded_call
    capped = events.index(ThinkingCapped(at_mark["timings"]["predicted_n"]))
    assert events[capped - 1] == Reasoning(at_mark["choices"][0]["delta"]["reasoning_content"])
    after = [e for e in events[capped:] if isinstance(e, Reasoning)]
    assert len(after) == case.meta["reasoning_events_after_control"]
    last = chunks[-1]["timings"]
    assert completion == Completion(
        id=recorded_call["id"],
        content=case.meta["content"],
        reasoning_content=case.meta["reasoning_content"],
        tool_calls=(),
        finish_reason=FinishReason(case.meta["finish_reason"]),
        timings=Timings(last["cache_n"], last["prompt_n"], last["predicted_n"]),
        reasoning_tokens=reasoning_chunks[-1]["timings"]["predicted_n"],
        thinking_capped=True,
    )
