"""Both clients on the in-memory fakes, with the brief's own limits: a `FakeClock` that moves only
when a read waits or the client sleeps, a `ScriptedTransport` replaying the fake server's scripts
and a `FakeSlotProbe` set by hand. Every wait is exact to the millisecond, and a ten-minute wait
costs no real time.

Every test runs twice (`client_kind`), with the same expected times and events: over the sync
`Client`, and over the `AsyncClient` (behind an `AsyncBridge`) on the awaited twins of the same
fakes (`AsyncFakeClock` over the same `FakeClock`, `AsyncScriptedTransport`, `AsyncFakeSlotProbe`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from pytest_mock import MockerFixture

import app.conversation_ids as conversation_ids
from adapters.fake_server import (
    NEVER,
    AsyncFakeClock,
    AsyncFakeSlotProbe,
    AsyncScriptedTransport,
    End,
    FakeClock,
    FakeSlotProbe,
    Piece,
    Reply,
    ScriptedTransport,
    error_reply,
    json_reply,
    loading,
    silence,
    sse_reply,
)
from adapters.fake_server.script import RouteSpec, sse_event
from app.client import Client, Props, SlotInfo, Token
from app.config import parse_config
from client_support import CHAT, CONTROL, EXPECT, SLOTS, STOP, Kind, overridden
from client_support import chunk as stream_chunk
from domain.chat_stream import REPLAY_OVERLAP_BYTES
from domain.completion import Completion, FinishReason, Timings
from domain.errors import (
    ConnectError,
    HttpError,
    LoadTimeout,
    ProtocolError,
    Stalled,
    ThinkingOverrun,
    WaitTimeout,
)
from domain.events import ChatEvent, Content, ModelWait, Progress, Reasoning, Retrying, ThinkingCapped, Waiting
from domain.hashing import sha256
from domain.messages import ChatRequest, UserMessage
from ports import SlotState

CID = "chatcmpl-QpnBZIma3eb1YjckyWftUEjfTdO3ZOIS"
REQ = ChatRequest(slot=1, messages=(UserMessage("hello"),))
BUSY, IDLE, UNAVAILABLE = SlotState.BUSY, SlotState.IDLE, SlotState.UNAVAILABLE
UNRESPONSIVE = Waiting(slot_busy=False, unresponsive=True)
chunk = partial(stream_chunk, cid=CID, cache_n=3, prompt_n=39)  # this stream has its own id and prompt


class ZeroJitter:
    def uniform(self, a: float, b: float) -> float:
        return 0.0


@dataclass
class Rig:
    client: Client
    clock: FakeClock
    transport: ScriptedTransport
    probe: FakeSlotProbe
    events: list[ChatEvent]

    def chat(self, *, retry: bool = False, on_event: Callable[[ChatEvent], None] | None = None) -> Completion:
        sink = on_event or self.events.append
        return self.client.chat_with_retry(REQ, sink) if retry else self.client.chat(REQ, sink)


@pytest.fixture
def rig_for(client_kind: Kind) -> Iterator[Callable[..., Rig]]:
    """Build a client from config (the brief's defaults unless given) on the in-memory fakes: the
    sync `Client` on the blocking fakes, or the `AsyncClient` on their awaited twins. With
    `http_probe=True` the container's own `/slots` probe asks the scripted transport (its `GET
    /slots` route) on the fake clock, and `rig.probe` is never asked."""

    def build(
        routes: dict[tuple[str, str], RouteSpec],
        *,
        slot: SlotState = UNAVAILABLE,
        rng: Any = None,
        http_probe: bool = False,
        **sections: Any,
    ) -> Rig:
        config = parse_config(
            {
                "socket": "/fake/llama.sock",
                "expect": EXPECT,
                **sections,
            }
        )
        clock = FakeClock()
        states = {REQ.slot: slot}
        header_bytes = config.limits.header_bytes
        fakes: dict[str, Any]
        if client_kind.is_async:
            transport: ScriptedTransport = AsyncScriptedTransport(clock, routes, header_bytes=header_bytes)
            probe: FakeSlotProbe = AsyncFakeSlotProbe(states)
            fakes = {"async_clock": AsyncFakeClock(clock), "async_transport": transport, "async_probe": probe}
        else:
            transport = ScriptedTransport(clock, routes, header_bytes=header_bytes)
            probe = FakeSlotProbe(states)
            fakes = {"clock": clock, "transport": transport, "probe": probe}
        if http_probe:
            del fakes["async_probe" if client_kind.is_async else "probe"]
        container = make(config, rng=rng or ZeroJitter(), **fakes)
        return Rig(client_kind.client_of(container), clock, transport, probe, [])

    with overridden() as make:
        yield build


ANSWER = [chunk({"content": "Hi"}, n=1), chunk({"content": "!"}, n=2), chunk(finish="stop", n=2)]
ANSWER_EVENTS: list[ChatEvent] = [Content("Hi"), Content("!")]
COMPLETION = Completion(CID, "Hi!", None, (), FinishReason.STOP, Timings(3, 39, 2), 0, False)
REATTACH = ("GET", "/v1/stream")


def replay_of(repeated: bytes, chunks: Sequence[Mapping[str, Any]]) -> Reply:
    """A re-attach's answer: the bytes it was asked to repeat, then `chunks`."""
    rest = sse_reply(list(chunks))
    return dataclasses.replace(rest, pieces=(Piece(0.0, repeated), *rest.pieces))


# -- the first-byte wait, at the brief's limits -----------------------------------------------------


def test_a_busy_slot_waits_exactly_busy_wait_ms_then_wait_timeout(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: silence()}, slot=BUSY)

    with pytest.raises(WaitTimeout, match=r"slot 1 stayed busy for 600000 ms \(limit 600000 ms\)"):
        rig.chat()

    assert rig.events == [Waiting(slot_busy=True)] * 120  # one per 5 s poll for 10 minutes
    assert rig.clock.now() == pytest.approx(600.0)
    assert rig.probe.asked == [1] * 120
    assert rig.transport.requests[0].client_closed.is_set()


def test_an_unavailable_server_waits_exactly_load_wait_ms_then_load_timeout(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: silence()}, slot=UNAVAILABLE)

    with pytest.raises(LoadTimeout):
        rig.chat()

    assert rig.events == [Waiting(slot_busy=False)] * 36
    assert rig.clock.now() == pytest.approx(180.0)


def test_an_idle_slot_with_no_answer_stalls_after_exactly_idle_grace_ms(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: silence()}, slot=IDLE)

    with pytest.raises(Stalled, match="idle with no answer"):
        rig.chat()

    assert rig.events == [Waiting(slot_busy=False)] * 6
    assert rig.clock.now() == pytest.approx(30.0)


def test_load_time_does_not_eat_into_the_busy_budget(rig_for: Callable[..., Rig]) -> None:
    # Ten polls while the model loads, then the slot is busy with someone else's request.
    rig = rig_for({CHAT: silence()}, slot=UNAVAILABLE)

    def on_event(event: ChatEvent) -> None:
        rig.events.append(event)
        if len(rig.events) == 10:
            rig.probe.states[REQ.slot] = BUSY

    with pytest.raises(WaitTimeout):
        rig.chat(on_event=on_event)

    assert rig.events == [Waiting(False)] * 10 + [Waiting(True)] * 120
    assert rig.clock.now() == pytest.approx(650.0)


def test_the_answer_starting_while_busy_ends_the_wait(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: sse_reply(ANSWER, head_delay_s=12.0)}, slot=BUSY)

    assert rig.chat() == COMPLETION

    assert rig.events == [Waiting(True), Waiting(True), *ANSWER_EVENTS]
    assert rig.clock.now() == pytest.approx(12.0)


def test_never_answering_and_a_flapping_slot_still_end(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: Reply(head_delay_s=NEVER)}, slot=BUSY)
    states = [BUSY, IDLE, UNAVAILABLE]

    def on_event(event: ChatEvent) -> None:
        rig.events.append(event)
        rig.probe.states[REQ.slot] = states[len(rig.events) % 3]

    with pytest.raises(Stalled):
        rig.chat(on_event=on_event)

    # Polls cycle busy, idle, unavailable: the sixth idle poll (the 17th overall, at 85 s) uses up
    # the 30 s grace, while 30 s of busy and 25 s of unavailable time are far from their limits.
    assert rig.events == [Waiting(True), Waiting(False), Waiting(False)] * 5 + [Waiting(True), Waiting(False)]
    assert rig.clock.now() == pytest.approx(85.0)


def test_a_server_that_answers_nothing_is_named_unresponsive_at_exactly_load_wait_ms(
    rig_for: Callable[..., Rig],
) -> None:
    # Paused or stuck: it takes every connection and answers none. Each poll is due 5 s after the
    # one before began and its probe hears nothing for its own 2 s, so 36 polls charge 5 s each.
    rig = rig_for({CHAT: silence(), SLOTS: silence()}, http_probe=True)

    with pytest.raises(LoadTimeout) as caught:
        rig.chat()

    assert str(caught.value) == (
        "slot 1: the server accepted connections but answered nothing for 180000 ms (unresponsive: paused or stuck), "
        "unavailable for 0 ms; limit 180000 ms for the two together; no data 180000 ms after sending, 36 polls"
    )
    assert rig.events == [UNRESPONSIVE] * 36
    assert rig.clock.now() == pytest.approx(182.0)  # the load budget, then the last probe's 2 s
    assert rig.probe.asked == []
    slots = [r for r in rig.transport.requests if r.path == SLOTS[1]]
    assert len(slots) == 36
    assert [r.time for r in slots] == pytest.approx([5.0 * n for n in range(1, 37)])
    assert all(r.closed_at == pytest.approx(r.time + 2.0) for r in slots)


def test_a_load_then_a_pause_share_the_load_budget_and_the_message_names_both(rig_for: Callable[..., Rig]) -> None:
    # Ten polls answered 503 (50 s loading), then silence: 26 polls of 5 s bring the two to 180 s.
    rig = rig_for({CHAT: silence(), SLOTS: [*[loading()] * 10, silence()]}, http_probe=True)

    with pytest.raises(LoadTimeout) as caught:
        rig.chat()

    assert str(caught.value) == (
        "slot 1: the model was loading for 50000 ms; "
        "the server accepted connections but answered nothing for 130000 ms (unresponsive: paused or stuck), "
        "unavailable for 0 ms; limit 180000 ms for them together; no data 180000 ms after sending, 36 polls"
    )
    assert rig.events == [Waiting(False, model=ModelWait.LOADING)] * 10 + [UNRESPONSIVE] * 26
    assert rig.clock.now() == pytest.approx(182.0)


# -- liveness ---------------------------------------------------------------------------------------


def test_silence_after_the_first_event_stalls_after_exactly_liveness_ms(rig_for: Callable[..., Rig]) -> None:
    # One attempt: the stall is raised as it is, with no re-attach and no retry wait after it.
    rig = rig_for(
        {CHAT: sse_reply(ANSWER[:1], head_delay_s=2.0, delay_s=1.0, done=False, end=End.SILENCE)},
        retry={"attempts": 1, "delays_ms": []},
    )

    with pytest.raises(Stalled, match=r"no data for 30000 ms \(liveness limit 30000 ms\)"):
        rig.chat()

    assert rig.events == [Content("Hi")]
    assert rig.clock.now() == pytest.approx(2.0 + 1.0 + 30.0)
    assert rig.probe.asked == [], "no poll once the head arrived"
    chat, stop = rig.transport.requests
    assert (chat.method, chat.path) == CHAT
    assert (stop.method, stop.target) == ("DELETE", f"/v1/stream?conv_id={chat.header('x-conversation-id')}")


def test_keep_alive_comments_move_no_deadline(rig_for: Callable[..., Rig]) -> None:
    pings = [b":\n\n"] * 20
    rig = rig_for(
        {CHAT: sse_reply([ANSWER[0], *pings], delay_s=7.0, done=False, end=End.SILENCE)},
        retry={"attempts": 1, "delays_ms": []},  # the stall as it is: no re-attach, no retry wait
    )

    with pytest.raises(Stalled):
        rig.chat()

    # The chunk at 7 s, pings at 14, 21, 28 and 35 s: the 37 s deadline falls between two pings.
    assert rig.events == [Content("Hi")]
    assert rig.clock.now() == pytest.approx(37.0)


def test_pings_that_come_past_the_liveness_limit_are_a_stall_picked_up_by_a_re_attach(
    rig_for: Callable[..., Rig],
) -> None:
    # The chunk at 15 s, then pings 15 s apart: the second lands exactly at the 30 s limit, so the
    # limit is found in the bytes that came, not by a read's timeout. It is the same stall: the
    # body is picked up from the bytes consumed, and the answer is whole.
    pings = [b": ping\n\n"] * 4
    cut = sse_reply([ANSWER[0], *pings], delay_s=15.0, done=False, end=End.SILENCE)
    # The replay repeats the last 64 bytes read (the two pings and the chunk's end) before the rest.
    fed = sse_event(ANSWER[0]) + 2 * pings[0]
    rig = rig_for({CHAT: cut, REATTACH: replay_of(fed[-REPLAY_OVERLAP_BYTES:], ANSWER[1:]), STOP: json_reply({})})

    completion = rig.chat()

    assert completion == COMPLETION
    (retrying,) = [e for e in rig.events if isinstance(e, Retrying)]
    assert retrying.error == "Stalled: no data for 30000 ms (liveness limit 30000 ms)"
    assert [e for e in rig.events if not isinstance(e, Retrying)] == ANSWER_EVENTS
    chat, reattach = rig.transport.requests
    consumed = len(fed)
    asked = consumed - REPLAY_OVERLAP_BYTES
    assert reattach.target == f"/v1/stream?conv_id={chat.header('x-conversation-id')}&from={asked}"


def test_no_error_or_log_line_of_a_re_attach_holds_the_conversation_id(
    rig_for: Callable[..., Rig], caplog: pytest.LogCaptureFixture
) -> None:
    # The chat and then its re-attach both cut: the second cut's error names the re-attach's
    # path, which carries the id that lets anyone read the replay.
    cut = sse_reply(ANSWER[:1], done=False, end=End.RESET)
    cut_again = sse_reply([], done=False, end=End.RESET)
    tail = sse_event(ANSWER[0])[-REPLAY_OVERLAP_BYTES:]  # the last bytes read, repeated by the replay
    rig = rig_for({CHAT: cut, REATTACH: [cut_again, replay_of(tail, ANSWER[1:])], STOP: json_reply({})})

    with caplog.at_level(logging.DEBUG, logger="inferpath"):
        assert rig.chat() == COMPLETION

    conversation = rig.transport.requests[0].header("x-conversation-id")
    retries = [e.error for e in rig.events if isinstance(e, Retrying)]
    assert len(retries) == 2
    assert "GET /v1/stream?conv_id=...&from=" in retries[1]
    lines = [r.getMessage() for r in caplog.records]
    assert any("GET /v1/stream?conv_id=...&from=" in line for line in lines)
    assert not [text for text in retries + lines if conversation in text]


def test_a_re_attach_answered_with_no_event_stream_is_a_protocol_error_naming_the_re_attach(
    rig_for: Callable[..., Rig],
) -> None:
    cut = sse_reply(ANSWER[:1], done=False, end=End.RESET)
    rig = rig_for({CHAT: cut, REATTACH: json_reply({"choices": []}), STOP: json_reply({})})

    with pytest.raises(ProtocolError) as caught:
        rig.chat()

    assert str(caught.value).startswith("GET /v1/stream?conv_id=...&from=")
    assert str(caught.value).endswith(": 200 answer is 'application/json; charset=utf-8', not an event stream")


def test_a_long_prompt_reporting_progress_has_no_total_deadline(rig_for: Callable[..., Rig]) -> None:
    # Thirty prompt batches 20 s apart: ten minutes of prompt processing, then the answer. The
    # prompt fits the slot and what the body can hold (progress past either keeps nothing alive).
    batches = [chunk({"role": "assistant", "content": None}, progress=(3_000, 0, 100 * i)) for i in range(30)]
    rig = rig_for({CHAT: sse_reply([*batches, *ANSWER], delay_s=20.0)}, expect={**EXPECT, "n_ctx": 32_768})

    completion = rig.chat()

    assert completion == COMPLETION
    assert rig.events == [*(Progress(3_000, 0, 100 * i) for i in range(30)), *ANSWER_EVENTS]
    # The call returns at the final chunk (the 4th of ANSWER): `[DONE]` is not waited for.
    assert rig.clock.now() == pytest.approx(20.0 * (30 + 3))


# -- retries ----------------------------------------------------------------------------------------


def test_connect_errors_are_retried_4_times_at_2_8_and_30_s(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: json_reply({})})
    rig.transport.refusing = True

    with pytest.raises(ConnectError):
        rig.chat(retry=True)

    assert [(e.attempt, e.after_ms) for e in rig.events if isinstance(e, Retrying)] == [
        (2, 2000),
        (3, 8000),
        (4, 30_000),
    ]
    assert rig.clock.now() == pytest.approx(40.0)


def test_jittered_waits_stay_within_a_quarter_of_each_delay(rig_for: Callable[..., Rig]) -> None:
    for seed in range(30):
        rig = rig_for({CHAT: json_reply({})}, rng=random.Random(seed))
        rig.transport.refusing = True
        with pytest.raises(ConnectError):
            rig.chat(retry=True)
        waits = [e.after_ms for e in rig.events if isinstance(e, Retrying)]
        assert len(waits) == 3
        for wait, delay in zip(waits, (2000, 8000, 30_000), strict=True):
            assert 0.75 * delay <= wait <= 1.25 * delay
        assert rig.clock.now() * 1000 == pytest.approx(sum(waits))


def test_retries_stop_before_a_wait_that_would_pass_five_minutes(rig_for: Callable[..., Rig]) -> None:
    # Each attempt waits out the 180 s load limit: 180 s, a 2 s wait, 180 s more. An 8 s wait
    # would end at 370 s, past the 300 s budget, so the third attempt is never made.
    rig = rig_for({CHAT: silence()}, slot=UNAVAILABLE)

    with pytest.raises(LoadTimeout):
        rig.chat(retry=True)

    assert rig.events == [
        *[Waiting(False)] * 36,
        Retrying(2, 2000, rig.events[36].error, resend=True),
        *[Waiting(False)] * 36,
    ]
    retry = rig.events[36]
    assert isinstance(retry, Retrying) and retry.error.startswith("LoadTimeout: slot 1 was unavailable")
    assert rig.clock.now() == pytest.approx(362.0)
    chats = [r for r in rig.transport.requests if (r.method, r.path) == CHAT]
    assert len(chats) == 2
    # Each attempt gave up on a request the server may have queued: each is stopped.
    stops = [r.target for r in rig.transport.requests if r.method == "DELETE"]
    assert stops == [f"/v1/stream?conv_id={r.header('x-conversation-id')}" for r in chats]


MODELS = ("GET", "/models")


@pytest.mark.parametrize(
    ("first", "retried", "besides"),
    [
        # An error answer starts no generation: nothing to stop.
        (error_reply(503, "Loading model", "unavailable_error"), True, []),
        # A cut after the head: a re-attach (refused by this server), `/models` asked whether a
        # router unloaded the model, the generation stopped, then the request again.
        (sse_reply(ANSWER[:1], done=False, end=End.RESET), True, [REATTACH, MODELS, STOP]),
        # A clean end without the final chunk is no cut: `/models` asked, stopped and sent
        # again, not re-attached.
        (sse_reply(ANSWER[:1], done=False, end=End.CLOSE), True, [MODELS, STOP]),
        (error_reply(400, "exceeds the available context size", "exceed_context_size_error"), False, []),
        (error_reply(500, "unknown reasoning_format"), False, []),
        (sse_reply([{"choices": "not a list", "id": CID}]), False, [STOP]),
    ],
    ids=["503", "cut", "no-finish", "400", "500", "malformed"],
)
def test_what_is_retried(
    rig_for: Callable[..., Rig], first: Reply, retried: bool, besides: list[tuple[str, str]]
) -> None:
    rig = rig_for({CHAT: [first, sse_reply(ANSWER)]})

    if retried:
        assert rig.chat(retry=True) == COMPLETION
        first_body, second_body = (r.body for r in rig.transport.requests if (r.method, r.path) == CHAT)
        assert first_body == second_body == rig.client.render(REQ)
        retries = [e for e in rig.events if isinstance(e, Retrying)]
        # A cut is re-attached first (refused here), then sent again at once: two, the last a re-send.
        assert [e.resend for e in retries] == ([False, True] if REATTACH in besides else [True])
        assert retries[-1].after_ms == (0 if REATTACH in besides else retries[-1].after_ms)
    else:
        with pytest.raises((HttpError, ProtocolError)):
            rig.chat(retry=True)
        assert not any(isinstance(e, Retrying) for e in rig.events)
    routes = [(r.method, r.path) for r in rig.transport.requests]
    assert routes == [CHAT, *besides, *([CHAT] if retried else [])]


# -- thinking cap -----------------------------------------------------------------------------------


def thinking(first: int, last: int, step: int = 1) -> list[dict[str, Any]]:
    return [chunk({"reasoning_content": f"<{n}>"}, n=n) for n in range(first, last + 1, step)]


def test_chunks_of_many_tokens_cap_where_the_count_passed_the_cap(rig_for: Callable[..., Rig]) -> None:
    # 100 tokens per chunk: the cap of 4096 is passed at 4100; 256 more are allowed (to 4356).
    stream = [*thinking(100, 4300, 100), chunk({"content": "ok"}, n=4301), chunk(finish="stop", n=4301)]
    rig = rig_for({CHAT: sse_reply(stream), CONTROL: json_reply({"success": True})})

    completion = rig.chat()

    capped = rig.events.index(ThinkingCapped(4100))
    assert rig.events[capped - 1] == Reasoning("<4100>")
    assert rig.events[capped + 1 :] == [Reasoning("<4200>"), Reasoning("<4300>"), Content("ok")]
    assert (completion.thinking_capped, completion.reasoning_tokens) == (True, 4300)
    control = [r for r in rig.transport.requests if (r.method, r.path) == CONTROL]
    assert [c.json() for c in control] == [{"id": CID, "action": "reasoning_end", "model": "default"}]


def test_reasoning_past_cap_plus_overrun_closes_the_stream(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: sse_reply(thinking(100, 5000, 100)), CONTROL: json_reply({"success": True})})

    with pytest.raises(ThinkingOverrun, match="went on to 4400 tokens after reasoning_end was posted at 4100"):
        rig.chat(retry=True)

    assert rig.events[-1] == Reasoning("<4400>")
    assert rig.transport.requests[0].client_closed.is_set()
    chat, control, stop = rig.transport.requests
    assert [(r.method, r.path) for r in (chat, control)] == [CHAT, CONTROL]
    assert (stop.method, stop.target) == ("DELETE", f"/v1/stream?conv_id={chat.header('x-conversation-id')}")


def test_thinking_that_ends_before_the_cap_asks_nothing(rig_for: Callable[..., Rig]) -> None:
    stream = [*thinking(1, 4095), chunk({"content": "ok"}, n=4096), chunk(finish="stop", n=4096)]
    rig = rig_for({CHAT: sse_reply(stream)})

    completion = rig.chat()

    assert (completion.thinking_capped, completion.reasoning_tokens) == (False, 4095)
    assert len(rig.transport.requests) == 1


def test_a_control_call_that_fails_to_connect_is_thinking_overrun(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for(
        {CHAT: sse_reply(thinking(1, 5000)), CONTROL: json_reply({"success": True})}, limits={"thinking_cap": 10}
    )

    def on_event(event: ChatEvent) -> None:
        rig.events.append(event)
        if event == Reasoning("<10>"):
            rig.transport.refusing = True  # the server went away just as the cap was reached

    with pytest.raises(ThinkingOverrun, match="ConnectError"):
        rig.chat(on_event=on_event)

    assert rig.events[-1] == Reasoning("<10>")
    assert rig.transport.requests[0].client_closed.is_set()


# -- the thinking cap whatever else a reasoning chunk carries -----------------------------------------

CAPPED = {"thinking_cap": 50, "thinking_overrun": 10}


def paired(first: int, last: int, step: int = 1) -> list[dict[str, Any]]:
    """Chunks whose deltas each carry a reasoning piece and a piece of the answer."""
    return [chunk({"reasoning_content": f"<{n}>", "content": f"[{n}]"}, n=n) for n in range(first, last + 1, step)]


def controls(rig: Rig) -> list[Any]:
    return [r.json() for r in rig.transport.requests if (r.method, r.path) == CONTROL]


# The stream, the reasoning tokens the cap is reached at, and the chunk (its predicted_n) that does.
PAIRED_SHAPES = {
    "reasoning and content in one delta": (paired(1, 55), 50, 50),
    # Five tokens of answer first: the reasoning's own tokens reach the cap at the 55th token.
    "after the answer began": ([*(chunk({"content": f"a{n}"}, n=n) for n in range(1, 6)), *paired(6, 60)], 50, 55),
    "many tokens in one chunk": ([*paired(1, 3), *paired(120, 125)], 120, 120),
}


@pytest.mark.parametrize(("stream", "capped_at", "at_chunk"), PAIRED_SHAPES.values(), ids=PAIRED_SHAPES.keys())
def test_reasoning_beside_an_answer_piece_is_capped_and_reasoning_end_posted(
    rig_for: Callable[..., Rig], stream: list[dict[str, Any]], capped_at: int, at_chunk: int
) -> None:
    last = stream[-1]["timings"]["predicted_n"]
    rig = rig_for(
        {CHAT: sse_reply([*stream, chunk(finish="stop", n=last)]), CONTROL: json_reply({"success": True})},
        limits=CAPPED,
    )

    completion = rig.chat()

    capped = rig.events.index(ThinkingCapped(capped_at))
    assert rig.events[capped - 2 : capped] == [Reasoning(f"<{at_chunk}>"), Content(f"[{at_chunk}]")]
    assert rig.events.count(ThinkingCapped(capped_at)) == 1
    assert controls(rig) == [{"id": CID, "action": "reasoning_end", "model": "default"}]
    assert completion.thinking_capped is True


def test_reasoning_beside_an_answer_piece_past_cap_plus_overrun_closes_the_stream(rig_for: Callable[..., Rig]) -> None:
    # A server that ignores the cap and pairs every reasoning token with a piece of answer.
    rig = rig_for({CHAT: sse_reply(paired(1, 300)), CONTROL: json_reply({"success": True})}, limits=CAPPED)

    with pytest.raises(ThinkingOverrun, match="went on to 61 tokens after reasoning_end was posted at 50"):
        rig.chat()

    assert rig.events[-2:] == [Reasoning("<61>"), Content("[61]")]
    assert ThinkingCapped(50) in rig.events
    assert controls(rig) == [{"id": CID, "action": "reasoning_end", "model": "default"}]
    assert rig.transport.requests[0].client_closed.is_set()


def test_a_final_chunk_whose_reasoning_reaches_the_cap_completes_capped_with_no_call(
    rig_for: Callable[..., Rig],
) -> None:
    # The answer is whole when its final chunk is read: there is nothing left to end.
    last = chunk({"reasoning_content": "<50>", "content": "ok"}, finish="stop", n=50)
    rig = rig_for({CHAT: sse_reply([*thinking(1, 49), last])}, limits=CAPPED)

    completion = rig.chat()

    assert rig.events[-3:] == [Reasoning("<50>"), Content("ok"), ThinkingCapped(50)]
    assert (completion.thinking_capped, completion.reasoning_tokens, completion.content) == (True, 50, "ok")
    assert [(r.method, r.path) for r in rig.transport.requests] == [CHAT]


def test_a_final_chunk_whose_reasoning_goes_past_the_overrun_is_thinking_overrun(rig_for: Callable[..., Rig]) -> None:
    last = chunk({"reasoning_content": "<61>"}, finish="stop", n=61)
    rig = rig_for({CHAT: sse_reply([*thinking(1, 50), last]), CONTROL: json_reply({"success": True})}, limits=CAPPED)

    with pytest.raises(ThinkingOverrun, match="went on to 61 tokens after reasoning_end was posted at 50"):
        rig.chat()

    assert rig.events[-1] == Reasoning("<61>")
    assert len(controls(rig)) == 1


# -- the rest of the contract -----------------------------------------------------------------------


def test_an_event_sink_that_raises_closes_the_stream_and_frees_the_slot(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: sse_reply(ANSWER)})

    def sink(event: ChatEvent) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rig.chat(on_event=sink)

    assert rig.transport.requests[0].client_closed.is_set()
    assert rig.chat() == COMPLETION, "the slot gate was released"


def test_each_chat_goes_out_under_an_id_made_while_the_last_answer_was_awaited(
    rig_for: Callable[..., Rig], mocker: MockerFixture
) -> None:
    made: list[str] = []
    real = conversation_ids.new_conversation_id

    def making() -> str:
        made.append(real())
        return made[-1]

    mocker.patch.object(conversation_ids, "new_conversation_id", side_effect=making)
    rig = rig_for({CHAT: [sse_reply(ANSWER), sse_reply(ANSWER)]})
    rig.chat()
    rig.chat()

    sent = [r.header("x-conversation-id") for r in rig.transport.requests if (r.method, r.path) == CHAT]
    assert len(made) == 3, "one id made for the first request, and one after each request went out"
    assert sent == made[:2], "the second request took the id made after the first went out"
    assert len(set(made)) == 3


def test_every_exchange_is_closed_after_a_completion(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: sse_reply(ANSWER)})
    rig.chat()
    assert all(r.client_closed.is_set() for r in rig.transport.requests)


def test_a_non_200_answer_keeps_at_most_error_body_bytes(rig_for: Callable[..., Rig]) -> None:
    rig = rig_for({CHAT: error_reply(400, "x" * 10_000)}, limits={"error_body_bytes": 100})

    with pytest.raises(HttpError) as caught:
        rig.chat()

    assert caught.value.status == 400
    assert caught.value.body == ('{"error":{"code":400,"message":"' + "x" * 100)[:100]


EVENT_LINES = 4096  # the least sse_line_bytes the config takes: at most as many data lines an event


@pytest.mark.parametrize(
    ("line", "lines", "error"),
    [
        (b"data: x\n", EVENT_LINES, "SSE data is not valid JSON"),
        (b"data:\n", EVENT_LINES + 1, f"SSE event of more than {EVENT_LINES} data lines"),
        (b"data: x\n", EVENT_LINES + 1, f"SSE event data over {EVENT_LINES} bytes"),
    ],
    ids=["at the caps: its data is read whole", "one line more", "one byte more"],
)
def test_an_event_of_many_short_data_lines_ends_the_call_in_the_same_protocol_error(
    rig_for: Callable[..., Rig], line: bytes, lines: int, error: str
) -> None:
    event = line * lines + b"\n"
    pieces = [event[i : i + 1000] for i in range(0, len(event), 1000)]
    rig = rig_for({CHAT: sse_reply([ANSWER[0], *pieces], done=False)}, limits={"sse_line_bytes": EVENT_LINES})

    with pytest.raises(ProtocolError) as caught:
        rig.chat()

    assert str(caught.value).startswith(error)
    assert rig.events == [Content("Hi")]


def test_info_calls_return_typed_results(rig_for: Callable[..., Rig]) -> None:
    template = "{%- for message in messages %}{{ message.content }}{% endfor %}"
    rig = rig_for(
        {
            ("GET", "/props"): json_reply(
                {"chat_template": template, "total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
            ),
            ("GET", "/slots"): json_reply([{"id": 0, "is_processing": False}, {"id": 1, "is_processing": True}]),
            ("POST", "/tokenize"): json_reply({"tokens": [{"id": 9707, "piece": "Hello"}]}),
        }
    )

    assert rig.client.props() == Props(template, sha256(template.encode()).hex(), 2, 4096)
    assert rig.client.slots() == [SlotInfo(0, False), SlotInfo(1, True)]
    assert rig.client.tokenize("Hello") == [Token(9707, "Hello", b"Hello")]
