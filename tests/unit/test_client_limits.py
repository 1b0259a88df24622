"""The client's limits to the millisecond and the byte, on the in-memory fakes: a retry judged by the
time spent so far, tokens past max_tokens that are no progress, an error body read for as long as the
liveness limit and kept up to its configured size, and the waits of an info call."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import Reply, json_reply, sse_reply
from adapters.fake_server.script import JSON_HEADERS, Piece
from app.config import parse_config
from app.container import client_limits
from client_support import CHAT, PROPS
from domain.errors import HttpError, Stalled
from domain.events import ChatEvent, Retrying
from scripted_client import ANSWER, REQ, chunk

pytestmark = pytest.mark.timeout(10)


def test_a_retry_is_judged_by_the_milliseconds_spent_so_far(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # The first attempt takes 2000 ms; a wait of 999 ms then ends at 2999 ms, inside a 3000 ms budget.
    retry = {"attempts": 2, "delays_ms": [999], "jitter": 0.0, "total_ms": 3000}
    routes = {CHAT: [Reply(503, JSON_HEADERS, [Piece(0.0, b"{}")], head_delay_s=2.0), sse_reply(ANSWER)]}
    client, _ = client_for(routes, retry=retry)
    events: list[ChatEvent] = []
    with caplog.at_level(logging.WARNING, logger="inferpath.client"):
        completion = client.chat_with_retry(REQ, events.append)
    assert completion.content == "Hi!"
    assert events[0] == Retrying(attempt=2, after_ms=999, error="HttpError: HTTP 503: {}", resend=True)
    assert [r.getMessage() for r in caplog.records] == [
        "slot 1: re-send as attempt 2 in 999 ms after HttpError (HTTP 503) "
        "(attempt 2 of 2; at most 999 ms of waits left)"
    ]


def test_tokens_past_max_tokens_do_not_keep_a_silent_stream_alive(client_for: Callable[..., Any]) -> None:
    # max_tokens 4: after "a", counts 5, 6, 7 arrive 600 ms apart with no text; they are no progress,
    # so the silence reaches the 1000 ms liveness limit before the final chunk.
    stream = [chunk({"content": "a"}, n=1), chunk(n=5), chunk(n=6), chunk(n=7), chunk(finish="stop", n=7)]
    client, _ = client_for({CHAT: sse_reply(stream, delay_s=0.6)}, limits={"max_tokens": 4, "liveness_ms": 1000})
    with pytest.raises(Stalled):
        client.chat(REQ, lambda event: None)


def test_an_error_body_is_read_until_the_liveness_limit_after_the_head(client_for: Callable[..., Any]) -> None:
    # The second piece comes 999.5 ms after the head, inside the 1000 ms the body may take.
    reply = Reply(500, JSON_HEADERS, [Piece(0.0, b"first "), Piece(0.9995, b"second")])
    client, _ = client_for({CHAT: reply}, limits={"liveness_ms": 1000})
    with pytest.raises(HttpError) as caught:
        client.chat(REQ, lambda event: None)
    assert caught.value.body == "first second"


def test_an_error_body_is_kept_up_to_the_configured_limit_even_past_4_kib(client_for: Callable[..., Any]) -> None:
    body = b"x" * 6000
    client, _ = client_for({CHAT: Reply(500, JSON_HEADERS, [Piece(0.0, body)])}, limits={"error_body_bytes": 8192})
    with pytest.raises(HttpError) as caught:
        client.chat(REQ, lambda event: None)
    assert caught.value.body == body.decode()


def test_an_info_call_waits_load_wait_ms_for_the_head_and_the_liveness_limit_for_the_body(
    client_for: Callable[..., Any],
) -> None:
    props = {"chat_template": "t", "total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    # The head comes 179.9 s after the request (load_wait_ms 180 s), the body 29.99 s after the head
    # (liveness_ms 30 s): both just inside their limits.
    client, _ = client_for({PROPS: json_reply(props, head_delay_s=179.9, delay_s=29.99)})
    assert client.props().total_slots == 2


@pytest.mark.parametrize(
    ("liveness_ms", "left_s", "wait_s"),
    [(5000, None, 0.25), (100, None, 0.1), (5000, 0.07, 0.07), (5000, 0.0, 0.0), (5000, -0.3, 0.0)],
    ids=["its-own", "liveness", "a-close's-left", "spent", "overspent"],
)
def test_a_stop_waits_its_own_time_or_what_a_close_left_it_or_not_at_all(
    liveness_ms: int, left_s: float | None, wait_s: float
) -> None:
    limits = client_limits(parse_config({"socket": "/s", "limits": {"liveness_ms": liveness_ms}}))

    assert limits.stop_wait_s(left_s) == pytest.approx(wait_s)
