"""A hostile server against the real client over a Unix socket: nothing it sends can keep a call
running without bound, make it wait past its limits, or end it outside the error table.

Limits as in `client_support`'s `TIMED` (liveness 100 ms, polls 100 ms). "Forever" is a script that would
go on for seconds; each test asserts the call ended within a few liveness periods.
"""

from __future__ import annotations

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
    json_reply,
    sse_event,
    sse_reply,
)
from client_support import ANSWER, ANSWER_COMPLETION, CHAT, CID, CONTROL, PROPS, REQ, ROLE, Kind, chunk
from domain.completion import FinishReason
from domain.errors import HttpError, InferError, ProtocolError, RequestError, Stalled, ThinkingOverrun
from domain.events import ChatEvent, Content, Reasoning, ThinkingCapped
from domain.messages import ChatRequest, UserMessage

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

LIVENESS_S = 0.1
# Well past one liveness period on a loaded machine, well short of the scripts' seconds.
ENDS_WITHIN_S = 0.6


def filler_every(filler: dict[str, Any], *, times: int = 50, every_s: float = 0.03) -> list[Piece]:
    return [Piece(every_s, sse_event(filler)) for _ in range(times)]


def stream_of(pieces: list[Piece]) -> Reply:
    """A chunked SSE reply: one delta, then `pieces`, then silence (no final chunk)."""
    first = Piece(0.0, sse_event(chunk({"content": "Paris"}, n=1)))
    return Reply(200, (("Content-Type", "text/event-stream"),), [first, *pieces], end=End.SILENCE, chunked=True)


NOTHING_NEW = {
    "empty-object": {},
    "no-choices": {"choices": []},
    "role-only": chunk(ROLE),
    "empty-delta": chunk({}),
    "empty-content": chunk({"content": ""}),
    "empty-reasoning": chunk({"reasoning_content": ""}),
    "same-predicted-n": chunk({"content": ""}, n=1),
    "same-progress": chunk(ROLE, progress=(42, 0, 42)),
    "progress-past-total": {"prompt_progress": {"total": 42, "cache": 0, "processed": 10_000, "time_ms": 1}},
    "tool-call-index-only": chunk({"tool_calls": [{"index": 0}]}),
    "tool-call-id-only": chunk({"tool_calls": [{"index": 0, "id": "call-1"}]}),
    "usage": {"choices": [], "usage": {"completion_tokens": 1}, "id": CID},
    # The first one names the call (progress); each repeat of the same name and id is nothing new.
    "same-tool-call-name": chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get_time"}}]}),
}


@pytest.mark.parametrize("filler", NOTHING_NEW.values(), ids=NOTHING_NEW.keys())
def test_events_that_carry_nothing_new_do_not_keep_a_stream_alive(
    server: FakeServer, filler: dict[str, Any], client_kind: Kind
) -> None:
    # 1.5 s of an event every 30 ms that moves the generation nowhere: exactly like keep-alive
    # comments, they leave the liveness limit running from the last delta.
    if filler in (NOTHING_NEW["same-progress"], NOTHING_NEW["progress-past-total"]):
        first = Piece(0.0, sse_event(chunk(ROLE, progress=(42, 0, 42))))
        pieces = [first, *filler_every(filler)]
    else:
        pieces = filler_every(filler)
    server.route(*CHAT, stream_of(pieces))
    started = time.monotonic()

    with pytest.raises(Stalled, match="liveness limit 100 ms"):
        client_kind.client_for(server, timed=True).chat(REQ, lambda event: None)

    assert time.monotonic() - started < ENDS_WITHIN_S
    (stream,) = [r for r in server.requests if (r.method, r.path) == CHAT]
    assert stream.client_closed.wait(2.0)


def test_tokens_that_advance_without_text_keep_the_stream_alive(server: FakeServer, client_kind: Kind) -> None:
    # The real server can hold text back (a partial stop word, a tool-call tag) while tokens
    # advance: a growing `predicted_n` is progress, for 0.6 s, six liveness periods.
    held = [chunk(ROLE, n=n) for n in range(2, 22)]
    server.route(
        *CHAT,
        sse_reply(
            [chunk({"content": "Paris"}, n=1), *held, chunk({"content": "."}, n=22), chunk(finish="stop", n=22)],
            delay_s=0.03,
        ),
    )

    completion = client_kind.client_for(server, timed=True).chat(REQ, lambda event: None)

    assert (completion.content, completion.finish_reason, completion.timings.predicted_n) == (
        "Paris.",
        FinishReason.STOP,
        22,
    )


def test_prompt_progress_that_grows_keeps_the_stream_alive(server: FakeServer, client_kind: Kind) -> None:
    batches = [chunk(ROLE, progress=(2000, 0, 100 * i)) for i in range(1, 21)]
    server.route(*CHAT, sse_reply([*batches, *ANSWER[1:]], delay_s=0.03))

    completion = client_kind.client_for(server, timed=True).chat(REQ, lambda event: None)

    assert completion.content == "Paris."


def test_tool_call_arguments_keep_the_stream_alive(server: FakeServer, client_kind: Kind) -> None:
    first = chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_time", "arguments": ""}}
            ]
        }
    )
    pieces = [chunk({"tool_calls": [{"index": 0, "function": {"arguments": "x"}}]}) for _ in range(20)]
    server.route(*CHAT, sse_reply([first, *pieces, chunk(finish="tool_calls")], delay_s=0.03))

    completion = client_kind.client_for(server, timed=True).chat(REQ, lambda event: None)

    assert completion.tool_calls[0].arguments == "x" * 20


# -- the thinking cap when predicted_n lies ------------------------------------------------------


@pytest.mark.parametrize("timings", ["stuck", "absent"])
def test_thinking_cap_fires_when_predicted_n_is_stuck_or_absent(
    server: FakeServer, timings: str, client_kind: Kind
) -> None:
    # 30 reasoning chunks, each with the same predicted_n (or none): the chunk count is the floor.
    def piece(n: int) -> dict[str, Any]:
        return chunk({"reasoning_content": f" t{n}"}, n=1 if timings == "stuck" else None)

    server.route(*CHAT, sse_reply([piece(n) for n in range(1, 31)], done=False, end=End.SILENCE))
    server.route(*CONTROL, json_reply({"success": True}))
    events: list[ChatEvent] = []

    with pytest.raises(ThinkingOverrun, match="reasoning went on to 13 tokens after reasoning_end was posted at 8"):
        client_kind.client_for(server, timed=True, thinking_cap=8, thinking_overrun=4).chat(REQ, events.append)

    assert events == [
        *(Reasoning(f" t{n}") for n in range(1, 9)),
        ThinkingCapped(8),
        *(Reasoning(f" t{n}") for n in range(9, 14)),
    ]


def test_reasoning_paired_with_answer_text_in_every_chunk_cannot_pass_the_cap(
    server: FakeServer, client_kind: Kind
) -> None:
    # A server that ignores the cap and sends every reasoning token beside a piece of answer.
    def pair(n: int) -> dict[str, Any]:
        return chunk({"reasoning_content": f" t{n}", "content": f"c{n}"}, n=n)

    server.route(*CHAT, sse_reply([pair(n) for n in range(1, 301)], done=False, end=End.SILENCE))
    server.route(*CONTROL, json_reply({"success": True}))
    events: list[ChatEvent] = []

    with pytest.raises(ThinkingOverrun, match="reasoning went on to 61 tokens after reasoning_end was posted at 50"):
        client_kind.client_for(server, timed=True, thinking_cap=50, thinking_overrun=10).chat(REQ, events.append)

    capped = events.index(ThinkingCapped(50))
    assert events[capped - 2 : capped] == [Reasoning(" t50"), Content("c50")]
    assert events[-2:] == [Reasoning(" t61"), Content("c61")]
    (control,) = [r for r in server.requests if (r.method, r.path) == CONTROL]
    assert control.json()["action"] == "reasoning_end"
    (stream,) = [r for r in server.requests if (r.method, r.path) == CHAT]
    assert stream.client_closed.wait(2.0)


# -- every wait has a bound ----------------------------------------------------------------------


def drip(data: bytes, every_s: float) -> list[Piece]:
    return [Piece(every_s, data[i : i + 1]) for i in range(len(data))]


def test_an_error_body_that_drips_is_cut_at_the_liveness_limit(server: FakeServer, client_kind: Kind) -> None:
    # A 500 whose 100-byte body comes one byte every 30 ms (3 s): the status is the news, and the
    # body is read for liveness_ms in all, not poll_ms per read.
    body = b'{"error":{"code":500,"message":"' + b"x" * 60 + b'","type":"server_error"}}'
    server.route(*CHAT, Reply(500, (("Content-Type", "application/json"),), drip(body, 0.03)))
    started = time.monotonic()

    with pytest.raises(HttpError) as caught:
        client_kind.client_for(server, timed=True).chat(REQ, lambda event: None)

    assert time.monotonic() - started < ENDS_WITHIN_S
    assert caught.value.status == 500
    assert 0 < len(caught.value.body) < len(body), "kept as far as it came"


@pytest.mark.parametrize("kept", [100, 65536])
@pytest.mark.parametrize("form", ["a data event", "an error field"])
def test_an_error_inside_the_stream_keeps_what_error_body_bytes_says(
    server: FakeServer, client_kind: Kind, kept: int, form: str
) -> None:
    error = '{"error":{"code":500,"message":"' + "m" * 6000 + '","type":"server_error"}}'
    event = sse_event(error) if form == "a data event" else b"error: " + error.encode() + b"\n\n"
    server.route(*CHAT, sse_reply([chunk(ROLE, n=0), chunk({"content": "Hi"}, n=1), event], done=False))

    with pytest.raises(HttpError) as caught:
        client_kind.client_for(server, timed=True, error_body_bytes=kept).chat(REQ, lambda event: None)

    assert caught.value.status == 500
    assert caught.value.body == error[:kept]


def test_a_json_answer_that_drips_is_stalled_at_the_liveness_limit(server: FakeServer, client_kind: Kind) -> None:
    body = b'{"chat_template":"' + b"x" * 100 + b'","total_slots":2,"default_generation_settings":{"n_ctx":4096}}'
    server.route(*PROPS, Reply(200, (("Content-Type", "application/json"),), drip(body, 0.03)))
    started = time.monotonic()

    with pytest.raises(Stalled):
        client_kind.client_for(server, timed=True).props()

    assert time.monotonic() - started < ENDS_WITHIN_S


@pytest.mark.parametrize("route", [CHAT, PROPS], ids=["chat", "props"])
def test_informational_responses_that_never_end_are_a_protocol_error_at_the_header_cap(
    server: FakeServer, client_kind: Kind, route: tuple[str, str]
) -> None:
    flood = Raw([Piece(0.0, b"HTTP/1.1 100 Continue\r\n\r\n" * 4000)], End.SILENCE)  # 100 KB, no head
    server.route(*route, flood)
    client = client_kind.client_for(server, timed=True)
    started = time.monotonic()

    with pytest.raises(
        ProtocolError, match=r"informational \(1xx\) responses and no response head: over the 16384-byte limit"
    ):
        if route == CHAT:
            client.chat(REQ, lambda event: None)
        else:
            client.props()

    assert time.monotonic() - started < ENDS_WITHIN_S


def test_the_final_chunk_returns_the_answer_at_once_even_if_silence_follows(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(ANSWER, done=False, end=End.SILENCE))
    started = time.monotonic()

    completion = client_kind.client_for(server, timed=True, liveness_ms=200).chat(REQ, lambda event: None)

    assert time.monotonic() - started < 0.1, "no wait for [DONE] or for the liveness limit"
    assert completion == ANSWER_COMPLETION
    (stream,) = [r for r in server.requests if (r.method, r.path) == CHAT]
    assert stream.client_closed.wait(2.0)


def test_nothing_after_the_final_chunk_changes_the_answer(server: FakeServer, client_kind: Kind) -> None:
    after = [chunk({"content": " And more."}, n=3), chunk(finish="length", n=3)]
    server.route(*CHAT, sse_reply([*ANSWER, *after]))
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert completion == ANSWER_COMPLETION
    assert Content(" And more.") not in events


def test_an_answer_past_answer_bytes_is_a_protocol_error(server: FakeServer, client_kind: Kind) -> None:
    pieces = [chunk({"content": "y" * 100}, n=n) for n in range(1, 50)]
    server.route(*CHAT, sse_reply([*pieces, chunk(finish="stop", n=50)]))

    with pytest.raises(ProtocolError, match="past the 4096-byte limit \\(answer_bytes\\)"):
        client_kind.client_for(server, timed=True, answer_bytes=4096).chat(REQ, lambda event: None)

    (stream,) = [r for r in server.requests if (r.method, r.path) == CHAT]
    assert stream.client_closed.wait(2.0)


def test_reasoning_and_tool_arguments_count_toward_answer_bytes(server: FakeServer, client_kind: Kind) -> None:
    reasoning = [chunk({"reasoning_content": "r" * 1500}, n=n) for n in range(1, 3)]
    call = chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "a" * 1500}}]})
    server.route(*CHAT, sse_reply([*reasoning, call, chunk(finish="tool_calls", n=3)]))

    with pytest.raises(ProtocolError, match="answer_bytes"):
        client_kind.client_for(server, timed=True, answer_bytes=4096).chat(REQ, lambda event: None)


# -- only errors from the table ------------------------------------------------------------------


def test_a_request_that_must_not_be_sent_is_an_infer_error(server: FakeServer, client_kind: Kind) -> None:
    # Callers catch InferError only: a bad request is one too, and nothing is sent.
    with pytest.raises(InferError, match="slot 7 is outside the server's 2 slots") as caught:
        client_kind.client_for(server, timed=True).chat(
            ChatRequest(slot=7, messages=(UserMessage("hi"),)), lambda event: None
        )

    assert isinstance(caught.value, RequestError)
    assert server.requests == []


def test_text_that_is_not_unicode_is_a_request_error(server: FakeServer, client_kind: Kind) -> None:
    with pytest.raises(RequestError, match="not valid Unicode"):
        client_kind.client_for(server, timed=True).chat(
            ChatRequest(slot=0, messages=(UserMessage("\ud800"),)), lambda event: None
        )
    with pytest.raises(RequestError, match="not valid Unicode"):
        client_kind.client_for(server, timed=True).tokenize("\udfff")

    assert server.requests == []


def test_a_control_answer_that_is_not_json_is_a_refusal(server: FakeServer, client_kind: Kind) -> None:
    stream = [chunk({"reasoning_content": f" t{n}"}, n=n) for n in range(1, 12)]
    server.route(*CHAT, sse_reply(stream, done=False, end=End.SILENCE))

    def control(request: RecordedRequest) -> Script:
        return Reply(200, (("Content-Type", "application/json"),), [Piece(0.0, b"[" * 5000)])

    server.route(*CONTROL, control)

    with pytest.raises(ThinkingOverrun, match="not accepted: the server answered non-JSON"):
        client_kind.client_for(server, timed=True, thinking_cap=8, thinking_overrun=4).chat(REQ, lambda event: None)


# -- values nested a thousand deep (orjson reads them; Python's repr of them fails) ---------------

DEEP = b"[" * 1000 + b"]" * 1000


def test_a_chunk_with_a_value_nested_a_thousand_deep_is_a_protocol_error(server: FakeServer, client_kind: Kind) -> None:
    deep = b'data: {"choices":[],"prompt_progress":{"total":' + DEEP + b',"cache":0,"processed":0}}\n\n'
    server.route(*CHAT, sse_reply([chunk(ROLE), deep]))
    with pytest.raises(ProtocolError, match=r"prompt_progress\.total is \[\[\["):
        client_kind.client_for(server, timed=True).chat(REQ, lambda event: None)


def test_an_answer_with_a_value_nested_a_thousand_deep_is_a_protocol_error(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(
        *PROPS, Reply(200, (("Content-Type", "application/json"),), [Piece(0.0, b'{"chat_template":' + DEEP + b"}")])
    )
    with pytest.raises(ProtocolError, match=r"chat_template is \[\[\["):
        client_kind.client_for(server, timed=True).props()


def test_text_alone_cannot_keep_a_call_alive_past_the_tokens_it_asked_for(
    server: FakeServer, client_kind: Kind
) -> None:
    # One character every 30 ms (well within liveness), no predicted_n, forever: with
    # max_tokens = 2 the answer may grow in 4 * 2 + 16 chunks, and the next one ends the call.
    drip = [Piece(0.03, sse_event(chunk({"content": "x"}, n=None))) for _ in range(200)]
    server.route(*CHAT, Reply(200, (("Content-Type", "text/event-stream"),), drip, end=End.SILENCE, chunked=True))
    started = time.monotonic()
    with pytest.raises(ProtocolError, match=r"grew in 25 chunks, more than max_tokens=2 allows"):
        client_kind.client_for(server, timed=True, max_tokens=2).chat(REQ, lambda event: None)
    assert time.monotonic() - started < 25 * 0.03 + ENDS_WITHIN_S
