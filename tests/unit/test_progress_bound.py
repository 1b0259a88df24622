"""Prompt progress keeps a call alive only within a bound the client knows (`max_prompt_tokens`),
not within whatever `total` the server's first report claims."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from client_support import stream_limits
from domain.assembler import Assembler
from domain.chat_stream import (
    PROMPT_TEMPLATE_TOKENS,
    PROMPT_TOKENS_PER_BODY_BYTE,
    ChatStream,
    prompt_token_bound,
)
from domain.errors import Stalled

HUGE = 2**62
LIMITS = stream_limits()


def progress(total: int, processed: int) -> dict[str, Any]:
    return {"choices": [], "prompt_progress": {"total": total, "cache": 0, "processed": processed, "time_ms": 1}}


def advanced(assembler: Assembler, *processed: int, total: int = HUGE) -> list[bool]:
    out = []
    for count in processed:
        assembler.feed(progress(total, count))
        out.append(assembler.advanced)
    return out


def test_progress_past_the_clients_bound_advances_nothing_whatever_total_the_server_claims() -> None:
    assembler = Assembler(max_prompt_tokens=1000)
    assert advanced(assembler, 10, 999, 1000, 1001, 10**6, HUGE) == [True, True, True, False, False, False]


def test_the_first_total_still_bounds_progress_when_it_is_below_the_clients_bound() -> None:
    assembler = Assembler(max_prompt_tokens=10**6)
    assert advanced(assembler, 50, 100, 101, total=100) == [True, True, False]


def test_without_a_bound_the_first_total_is_the_only_one() -> None:
    # What callers that do not pass `max_prompt_tokens` get: the earlier rule.
    assert advanced(Assembler(), 10, 10**6, 10**12, total=HUGE) == [True, True, True]


def chunk_bytes(total: int, processed: int) -> bytes:
    return b"data: " + orjson.dumps(progress(total, processed)) + b"\n\n"


def test_a_server_inflating_its_progress_past_the_bound_stalls_at_the_liveness_limit() -> None:
    stream = ChatStream(LIMITS, max_tokens=100, now=0.0, max_prompt_tokens=4096)
    now = 0.0
    processed = 0
    steps: list[object] = []
    while not steps or not isinstance(steps[-1], Stalled):
        now += 0.25
        processed += 1024  # 1024 more every quarter second: past 4096 after one second
        steps = stream.feed(chunk_bytes(HUGE, processed), now)
        assert now < 10, "the stream never stalled"
    # The last report that counted was 4096 tokens at 1.0 s; a second later the stream stalled.
    assert now == pytest.approx(2.0)


def test_without_the_bound_the_same_server_keeps_the_call_alive() -> None:
    stream = ChatStream(LIMITS, max_tokens=100, now=0.0)
    for step in range(1, 41):
        steps = stream.feed(chunk_bytes(HUGE, step * 1024), step * 0.25)
        assert not any(isinstance(s, Stalled) for s in steps)
    assert stream.timeout(10.0) > 0  # still alive after 10 s of inflated progress


def test_a_known_context_only_tightens_the_bound_the_body_gives() -> None:
    # The context a server claims (from /props) can be 2**31 - 1: it never loosens the bound.
    assert prompt_token_bound(10, 32768) == 2 * 10 + 4096
    assert prompt_token_bound(10, 2**31 - 1) == 2 * 10 + 4096
    assert prompt_token_bound(10**9, 4096) == 4096


def test_without_the_context_the_bound_follows_the_body_size() -> None:
    assert PROMPT_TOKENS_PER_BODY_BYTE == 2 and PROMPT_TEMPLATE_TOKENS == 4096
    assert prompt_token_bound(0, None) == 4096
    assert prompt_token_bound(1000, None) == 2 * 1000 + 4096


def test_a_body_rendered_one_token_a_byte_stays_within_the_bound() -> None:
    # The worst a tokenizer does is one token a byte; a schema that the template re-renders
    # with a space after each separator grows by less than half.
    schema = orjson.dumps({"enum": [1] * 1000})
    rendered = schema.replace(b",", b", ").replace(b":", b": ")
    assert len(rendered) < PROMPT_TOKENS_PER_BODY_BYTE * len(schema)
    assert len(rendered) <= prompt_token_bound(len(schema), None)


@pytest.mark.parametrize(("body_len", "n_ctx"), [(-1, None), (10, 0), (10, -5)])
def test_a_bound_from_nonsense_is_refused(body_len: int, n_ctx: int | None) -> None:
    with pytest.raises(ValueError):
        prompt_token_bound(body_len, n_ctx)
