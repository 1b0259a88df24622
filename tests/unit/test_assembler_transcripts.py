"""Recorded streams reassemble to the server's own non-stream answer, however the bytes are cut.

The brief's "streamed deltas reassemble exactly": for every recorded stream, the body cut at any
points, decoded by the SSE decoder and fed to the assembler, gives a `Completion` whose content,
reasoning, tool calls and finish reason equal the `message` of the non-stream answer the server
gave to the same request. Tool-call ids are random per request, so only their presence is
compared. A stream whose reasoning was ended by a control call has no non-stream twin (its
`nonstream.json` is the runaway answer without the call); it is checked against the text of its
own deltas instead.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.assembler import Assembler
from domain.completion import Completion, FinishReason
from domain.events import Content, Progress, Reasoning
from domain.sse import SseData, SseDecoder, SseDone, parse_chunk
from transcripts import Case, case_params, load_case


def _is_stream(case: Case) -> bool:
    content_type = (case.response.header("Content-Type") or "").lower()
    return case.status == 200 and "text/event-stream" in content_type


STREAM_CASES = case_params(_is_stream, none_reason="no streamed case recorded")


def assemble(body: bytes, cuts: list[int]) -> tuple[Completion, list[Any]]:
    """Decode `body` fed in pieces cut at `cuts`, and assemble it, as the client does."""
    decoder = SseDecoder()
    assembler = Assembler()
    events: list[Any] = []
    bounds = [0, *sorted(set(cuts)), len(body)]
    done = False
    for start, end in itertools.pairwise(bounds):
        for sse in decoder.feed(body[start:end]):
            if type(sse) is SseData:
                events.extend(assembler.feed(parse_chunk(sse.data)))
            elif type(sse) is SseDone:
                done = True
    decoder.end()
    assert done, "the recorded stream ends with [DONE]"
    return assembler.result(), events


def expected_message(case: Case) -> dict[str, Any] | None:
    nonstream = case.nonstream
    if not nonstream or "control_request.json" in case.files:
        return None  # no twin, or a control call changed the stream
    choice = nonstream["choices"][0]
    message: dict[str, Any] = choice["message"]
    return {
        # The non-stream answer may say "" where the stream sent no content delta at all.
        "content": message.get("content") or None,
        "reasoning_content": message.get("reasoning_content") or None,
        "tool_calls": [
            (call["function"]["name"], call["function"]["arguments"]) for call in message.get("tool_calls") or []
        ],
        "finish_reason": FinishReason(choice["finish_reason"]),
    }


def check(case: Case, completion: Completion, events: list[Any]) -> None:
    expected = expected_message(case)
    if expected is None:
        texts = [c["choices"][0]["delta"] for c in case.events() if c.get("choices")]
        content = "".join(d.get("content") or "" for d in texts) or None
        reasoning = "".join(d.get("reasoning_content") or "" for d in texts) or None
        assert (completion.content, completion.reasoning_content) == (content, reasoning)
    else:
        assert completion.content == expected["content"]
        assert completion.reasoning_content == expected["reasoning_content"]
        assert [(c.name, c.arguments) for c in completion.tool_calls] == expected["tool_calls"]
        assert all(c.id for c in completion.tool_calls)
        assert completion.finish_reason is expected["finish_reason"]
    assert "".join(e.text for e in events if isinstance(e, Content)) == (completion.content or "")
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == (completion.reasoning_content or "")
    assert completion.id.startswith("chatcmpl-")
    assert completion.timings.predicted_n > 0


@pytest.mark.parametrize("name", STREAM_CASES)
def test_whole_stream_reassembles_to_the_non_stream_answer(name: str) -> None:
    case = load_case(name)
    completion, events = assemble(case.body, [])
    check(case, completion, events)


@pytest.mark.parametrize("name", STREAM_CASES)
def test_stream_fed_byte_by_byte_reassembles_the_same(name: str) -> None:
    case = load_case(name)
    whole, whole_events = assemble(case.body, [])
    completion, events = assemble(case.body, list(range(1, len(case.body))))
    assert (completion, events) == (whole, whole_events)


@pytest.mark.parametrize("name", STREAM_CASES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_cutting_of_the_stream_reassembles_the_same(name: str, data: st.DataObject) -> None:
    case = load_case(name)
    whole, whole_events = assemble(case.body, [])
    size = len(case.body)
    cuts = data.draw(st.lists(st.integers(1, max(1, size - 1)), max_size=64), label="cuts")
    completion, events = assemble(case.body, cuts)
    assert (completion, events) == (whole, whole_events)


@pytest.mark.parametrize("name", STREAM_CASES)
def test_progress_counts_only_grow(name: str) -> None:
    # Not "progress before any delta": with an assistant prefill the server streams the
    # prefill's parsed tool-call opening in the same chunk as the first progress event.
    case = load_case(name)
    _, events = assemble(case.body, [])
    progress = [e for e in events if isinstance(e, Progress)]
    assert [p.processed for p in progress] == sorted(p.processed for p in progress)
    assert all(p.cache <= p.processed <= p.total for p in progress)
