"""A server's value quoted in an error (`domain.errors.shown`) is bounded whatever the value: a
JSON value nested a thousand levels deep (orjson reads up to 1024; Python's repr fails before
1000) is a `ProtocolError` with a short message wherever the client quotes it, never a
`RecursionError` escaping the call."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from domain.assembler import Assembler
from domain.errors import SHOWN_CHARS, ProtocolError, shown
from domain.llama_api import control_refusal, parse_props, parse_slot_action, parse_slots, parse_token_ids, parse_tokens

DEPTH = 1000


def deep(depth: int = DEPTH) -> Any:
    return orjson.loads(b"[" * depth + b"]" * depth)


def deep_json(depth: int = DEPTH) -> bytes:
    return b"[" * depth + b"]" * depth


def test_a_value_nested_a_thousand_deep_is_shown_in_a_few_characters() -> None:
    value = deep()
    with pytest.raises(RecursionError):
        repr(value)  # what a plain repr does with it
    text = shown(value)
    assert text.startswith("[[[") and len(text) <= SHOWN_CHARS + 3


@pytest.mark.parametrize(
    "value",
    ["x" * 10_000, list(range(10_000)), {str(i): i for i in range(10_000)}, 10**4000 // 7, 10**5000, b"\xff" * 5000],
    ids=["long text", "long list", "big dict", "huge int", "int with no repr", "bytes"],
)
def test_a_long_value_is_shown_in_at_most_the_limit(value: object) -> None:
    assert len(shown(value)) <= SHOWN_CHARS + 3


CHUNKS: dict[str, Any] = {
    "prompt_progress.total": {"choices": [], "prompt_progress": {"total": deep(), "cache": 0, "processed": 0}},
    "timings": {"choices": [], "timings": deep()},
    "timings.predicted_n": {"choices": [], "timings": {"predicted_n": deep()}},
    "finish_reason": {"choices": [{"index": 0, "delta": {}, "finish_reason": deep()}]},
    "tool call index": {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": deep()}]}}]},
    "a malformed choice": {"choices": [{"index": 0, "delta": deep()}]},
}


@pytest.mark.parametrize("chunk", list(CHUNKS.values()), ids=list(CHUNKS))
def test_a_chunk_with_a_deeply_nested_value_is_a_short_protocol_error(chunk: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as caught:
        Assembler(max_predicted=16).feed(chunk)
    assert len(str(caught.value)) < 400


ANSWERS: dict[str, tuple[Any, bytes]] = {
    "/props": (parse_props, b'{"chat_template":' + deep_json() + b"}"),
    "/slots": (parse_slots, b"[" + deep_json(DEPTH - 1) + b"]"),
    "/tokenize": (parse_tokens, b'{"tokens":[{"id":1,"piece":' + deep_json(DEPTH - 3) + b"}]}"),
    "token ids": (parse_token_ids, b'{"tokens":[' + deep_json(DEPTH - 2) + b"]}"),
    "slot action": (
        lambda raw: parse_slot_action(raw, "n_saved", "n_written", "save"),
        b'{"n_saved":' + deep_json() + b"}",
    ),
}


@pytest.mark.parametrize("parse,raw", list(ANSWERS.values()), ids=list(ANSWERS))
def test_an_answer_with_a_deeply_nested_value_is_a_short_protocol_error(parse: Any, raw: bytes) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(raw)
    assert len(str(caught.value)) < 400


def test_a_control_answer_with_a_deeply_nested_value_is_a_short_refusal() -> None:
    refusal = control_refusal(b'{"success":' + deep_json() + b"}")
    assert refusal is not None and len(refusal) < 400
