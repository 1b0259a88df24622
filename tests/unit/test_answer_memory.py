"""Memory follows the answer's caps, whatever the server sends: tool calls are counted against
`limits.tool_calls`, and streamed text is kept compactly, not as one object per delta."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import pytest

from app.config import MAX_TOOL_CALLS, ConfigError, Limits, parse_config
from app.container import client_limits
from client_support import stream_limits
from domain.assembler import Assembler
from domain.chat_stream import ChatStream
from domain.completion import Completion
from domain.errors import ProtocolError
from domain.messages import ToolCall

T = TypeVar("T")
KIB = 1024


def tool_delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **fields}]}}]}


def content(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def reasoning(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"reasoning_content": text}}]}


FINISH: dict[str, Any] = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


# -- the number of tool calls ----------------------------------------------------------------------


def test_tool_calls_up_to_the_limit_are_taken_and_one_more_index_is_refused_naming_the_limit() -> None:
    asm = Assembler(max_tool_calls=3)
    for index in range(3):
        asm.feed(tool_delta(index, id=f"call_{index}", function={"name": "f", "arguments": "{}"}))
    asm.feed(tool_delta(1, function={"arguments": ""}))  # a known index costs nothing more
    with pytest.raises(ProtocolError) as caught:
        asm.feed(tool_delta(7))
    assert str(caught.value) == "the answer grew past the 3-tool-call limit (tool_calls) with index 7 after 5 chunks"


def test_a_flood_of_empty_deltas_with_new_indexes_ends_at_the_limit() -> None:
    asm = Assembler(max_tool_calls=128)
    for index in range(128):
        assert asm.feed(tool_delta(index)) != ()
    with pytest.raises(ProtocolError, match=r"\(tool_calls\)"):
        asm.feed(tool_delta(128))


def test_the_stream_limits_carry_the_tool_call_limit_to_the_assembler() -> None:
    limits = stream_limits(tool_calls=2)
    stream = ChatStream(limits, max_tokens=100, now=0.0)
    body = b"".join(b"data: " + orjson.dumps(tool_delta(i)) + b"\n\n" for i in range(3))
    steps = stream.feed(body, now=0.1)
    assert isinstance(steps[-1], ProtocolError)
    assert "2-tool-call limit (tool_calls)" in str(steps[-1])


def test_the_config_key_defaults_to_128_is_bounded_and_reaches_the_stream_limits() -> None:
    assert Limits().tool_calls == 128
    assert MAX_TOOL_CALLS == 65536
    config = parse_config({"socket": "/s", "limits": {"tool_calls": 65536}})
    assert client_limits(config).stream.tool_calls == 65536
    assert client_limits(parse_config({"socket": "/s"})).stream.tool_calls == 128
    for bad in (0, 65537, "8", 1.0):
        with pytest.raises(ConfigError, match=r"limits\.tool_calls"):
            parse_config({"socket": "/s", "limits": {"tool_calls": bad}})


# -- streamed text ---------------------------------------------------------------------------------


def traced(work: Callable[[], T]) -> tuple[T, int, int]:
    """`work()`, with the memory it left allocated and its peak, in bytes, on a thread of its
    own (tracemalloc walks the whole stack on each allocation; a new thread's is short)."""
    out: list[tuple[T, int, int]] = []

    def measure() -> None:
        tracemalloc.start()
        try:
            result = work()
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        out.append((result, current, peak))

    thread = threading.Thread(target=measure)
    thread.start()
    thread.join()
    return out[0]


@pytest.mark.parametrize("make", [content, reasoning], ids=["content", "reasoning"])
def test_one_character_deltas_are_held_in_about_their_own_size(make: Callable[[str], dict[str, Any]]) -> None:
    # One `str` per delta would cost about 50 bytes for each byte of answer.
    chunks = [make("ab"[i % 2]) for i in range(200_000)]
    asm, held, _ = traced(lambda: _fed(Assembler(), chunks))
    assert held <= 1.25 * len(chunks) + 16 * KIB, f"{held:,} bytes held for {len(chunks):,} bytes of answer"
    done, _, peak = traced(asm.result)
    text = done.content if make is content else done.reasoning_content
    assert text == "ab" * 100_000
    assert peak <= 1.25 * len(chunks) + 16 * KIB  # the `str` alone: 1 byte a character


def test_tool_call_arguments_are_held_in_about_their_own_size() -> None:
    chunks = [tool_delta(0, id="call_0", function={"name": "f", "arguments": ""})]
    chunks += [tool_delta(0, function={"arguments": "x"}) for _ in range(200_000)]
    asm, held, _ = traced(lambda: _fed(Assembler(), chunks))
    assert held <= 1.25 * 200_000 + 16 * KIB, f"{held:,} bytes held for 200,000 bytes of arguments"
    done = asm.result()
    assert done.tool_calls == (ToolCall("call_0", "f", "x" * 200_000),)


def _fed(asm: Assembler, chunks: list[dict[str, Any]]) -> Assembler:
    for chunk in chunks:
        asm.feed(chunk)
    asm.feed(FINISH)
    return asm


def test_the_answer_cap_counts_utf8_bytes_of_every_kind_of_text() -> None:
    asm = Assembler(max_answer_bytes=10)
    asm.feed(content("żó"))  # 4 bytes
    asm.feed(reasoning("🐢"))  # 4 bytes
    asm.feed(tool_delta(0, function={"name": "f", "arguments": "x"}))  # 2 bytes: 10 in all
    with pytest.raises(ProtocolError, match="10-byte limit"):
        asm.feed(content("a"))


def test_text_split_anywhere_is_assembled_exactly() -> None:
    pieces = ["żó", "łw ", "🐢", "", "漢字", "\u2028", "a\x00b"]
    asm = Assembler()
    for piece in pieces:
        asm.feed(content(piece))
        asm.feed(reasoning(piece[::-1]))
        asm.feed(tool_delta(0, function={"arguments": piece}))
    asm.feed(tool_delta(0, function={"name": "f"}))
    asm.feed(FINISH)
    done = asm.result()
    assert isinstance(done, Completion)
    assert done.content == "".join(pieces)
    assert done.reasoning_content == "".join(p[::-1] for p in pieces)
    assert done.tool_calls[0].arguments == "".join(pieces)


def test_text_that_cannot_be_utf8_is_a_malformed_chunk() -> None:
    # orjson never yields a lone surrogate, but a chunk handed in as a dict may hold one.
    asm = Assembler()
    with pytest.raises(ProtocolError, match="malformed chunk 1"):
        asm.feed(content("\udc80"))
