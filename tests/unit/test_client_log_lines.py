"""What the client logs, word for word, on the in-memory fakes: each answer's counts and its cache
outcome against the answer before, the response head with its wait, and the reasoning_end call with
the server's answer."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import json_reply, sse_reply
from client_support import CHAT, CONTROL
from domain.cache import cache_outcome
from domain.completion import Timings
from domain.errors import ThinkingOverrun
from scripted_client import ANSWER, REQ, chunk

pytestmark = pytest.mark.timeout(10)


def test_each_answer_is_logged_with_its_counts_and_the_cache_outcome_against_the_one_before(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = client_for({CHAT: [sse_reply(ANSWER), sse_reply(ANSWER)]})
    with caplog.at_level(logging.DEBUG, logger="inferpath.client"):
        client.chat(REQ, lambda event: None)
        client.chat(REQ, lambda event: None)
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("slot 1: stop")]
    against = [r.getMessage() for r in caplog.records if "against the request before it" in r.getMessage()]
    assert done == ["slot 1: stop, 42 prompt tokens (3 cached), 2 predicted, 0 reasoning"] * 2
    timings = Timings(cache_n=3, prompt_n=39, predicted_n=2)
    assert against == [f"slot 1: against the request before it: {cache_outcome(timings, timings)}"]


def test_the_response_head_is_logged_with_its_status_and_wait(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = client_for({CHAT: sse_reply(ANSWER, head_delay_s=0.25)})
    with caplog.at_level(logging.DEBUG, logger="inferpath.client"):
        client.chat(REQ, lambda event: None)
    assert "slot 1: response head 200 after 250 ms" in [r.getMessage() for r in caplog.records]


def reasoning(n: int) -> dict[str, Any]:
    return chunk({"reasoning_content": "hm"}, n=n)


@pytest.mark.parametrize(
    ("answer", "logged"),
    [
        ({"success": True}, "reasoning_end posted: accepted"),
        ({"success": False, "why": "MARKER-7f3a"}, "reasoning_end posted: refused"),
    ],
)
def test_the_reasoning_end_call_is_logged_as_accepted_or_refused_without_the_servers_text(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture, answer: dict[str, Any], logged: str
) -> None:
    stream = [reasoning(1), reasoning(2), chunk({"content": "Hi"}, n=3), chunk(finish="stop", n=3)]
    client, _ = client_for({CHAT: sse_reply(stream), CONTROL: json_reply(answer)}, limits={"thinking_cap": 2})
    with caplog.at_level(logging.DEBUG, logger="inferpath.client"), contextlib.suppress(ThinkingOverrun):
        client.chat(REQ, lambda event: None)
    assert logged in [r.getMessage() for r in caplog.records]
    assert not any("MARKER-7f3a" in r.getMessage() for r in caplog.records)
