"""Any way of cutting a message into deltas reassembles to that message (generated streams)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.assembler import Assembler
from domain.completion import FinishReason, Timings
from domain.errors import StreamClosedEarly
from domain.events import Content, Progress, Reasoning, ToolCallDelta
from domain.messages import ToolCall

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@st.composite
def pieces(draw: st.DrawFn, text: str) -> list[str]:
    """`text` cut at arbitrary points into non-empty pieces."""
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=len(text))))
    bounds = [0, *[c for c in cuts if 0 < c < len(text)], len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@st.composite
def streams(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    reasoning = draw(st.none() | TEXT.filter(bool))
    content = draw(st.none() | TEXT.filter(bool))
    calls = draw(st.lists(st.tuples(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), TEXT), max_size=3))
    finish = draw(st.sampled_from(["stop", "length", "tool_calls"]))
    prompt = draw(st.integers(1, 5000))
    cached = draw(st.integers(0, prompt))
    chunks: list[dict[str, Any]] = []
    predicted = 0

    def emit(delta: dict[str, Any], **extra: Any) -> None:
        chunks.append({"choices": [{"index": 0, "delta": delta, "finish_reason": None}], "id": "c-1", **extra})

    def timings() -> dict[str, int]:
        return {"cache_n": cached, "prompt_n": prompt - cached, "predicted_n": predicted}

    role = {"role": "assistant", "content": None}
    emit(role, prompt_progress={"total": prompt, "cache": cached, "processed": cached})
    emit(role, prompt_progress={"total": prompt, "cache": cached, "processed": prompt})
    for piece in draw(pieces(reasoning)) if reasoning else []:
        predicted += draw(st.integers(1, 3))
        emit({"reasoning_content": piece}, timings=timings())
    reasoning_tokens = predicted
    for piece in draw(pieces(content)) if content else []:
        predicted += 1
        emit({"content": piece}, timings=timings())
    for index, (name, arguments) in enumerate(calls):
        args = draw(pieces(arguments)) if arguments else []
        function: dict[str, str] = {"name": name}
        if args:
            function["arguments"] = args[0]
        first = {"index": index, "id": f"id{index}", "type": "function", "function": function}
        predicted += 1
        emit({"tool_calls": [first]}, timings=timings())
        for piece in args[1:]:
            predicted += 1
            emit({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, timings=timings())
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "id": "c-1", "timings": timings()})
    expected = {
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": [ToolCall(f"id{i}", name, args) for i, (name, args) in enumerate(calls)],
        "finish_reason": FinishReason(finish),
        "timings": Timings(cached, prompt - cached, predicted),
        "reasoning_tokens": reasoning_tokens,
        "prompt": (prompt, cached),
    }
    return expected, chunks


@settings(max_examples=150, deadline=None)
@given(streams())
def test_any_delta_cutting_reassembles_the_message(case: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    expected, chunks = case
    asm = Assembler()
    events = [e for c in chunks for e in asm.feed(c)]
    done = asm.result()
    assert done.content == expected["content"]
    assert done.reasoning_content == expected["reasoning_content"]
    assert list(done.tool_calls) == expected["tool_calls"]
    assert done.finish_reason is expected["finish_reason"]
    assert done.timings == expected["timings"]
    assert done.reasoning_tokens == expected["reasoning_tokens"]
    assert done.id == "c-1"
    # The events carry the same text, in order, and nothing else.
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == (expected["reasoning_content"] or "")
    assert "".join(e.text for e in events if isinstance(e, Content)) == (expected["content"] or "")
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    for call_index, call in enumerate(expected["tool_calls"]):
        mine = [d for d in deltas if d.index == call_index]
        assert "".join(d.arguments for d in mine) == call.arguments
        assert mine[0].id == call.id and mine[0].name == call.name
    prompt, cached = expected["prompt"]
    assert [e for e in events if isinstance(e, Progress)] == [
        Progress(prompt, cached, cached),
        Progress(prompt, cached, prompt),
    ]


@settings(max_examples=40, deadline=None)
@given(streams())
def test_a_stream_cut_before_its_final_chunk_never_gives_a_completion(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    _, chunks = case
    asm = Assembler()
    for c in chunks[:-1]:
        asm.feed(c)
    try:
        asm.result()
    except StreamClosedEarly:
        return
    raise AssertionError("a stream without its final chunk gave a completion")
