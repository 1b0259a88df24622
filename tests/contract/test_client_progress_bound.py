"""A server cannot keep a call alive with prompt progress that never ends: progress advances the
liveness deadline only up to a bound the client knows (the slot's `n_ctx` from `[expect]` or
`/props`), whatever `total` the server claims."""

from __future__ import annotations

import time
from typing import Any

import pytest

from adapters.fake_server import FakeServer, json_reply, sse_reply
from client_support import CHAT, PROPS, REQ, Kind, chunk
from domain.errors import Stalled

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

HUGE = 2**62


def endless_progress(step: int, count: int) -> list[dict[str, Any]]:
    """Prompt progress that grows by `step` each event against a `total` of 2**62."""
    return [chunk(None, progress=(HUGE, 0, step * n)) for n in range(1, count + 1)]


@pytest.mark.parametrize("n_ctx_from", ["expect", "props"])
def test_progress_past_the_slots_context_keeps_no_call_alive(
    server: FakeServer, client_kind: Kind, n_ctx_from: str
) -> None:
    # 4096 tokens of context (EXPECT): progress up to it counts; 200 more events at 20 ms each,
    # 4 s in all, would keep a client that trusted the server's total alive for their whole length.
    server.route(*CHAT, sse_reply(endless_progress(1024, 204), delay_s=0.02))
    if n_ctx_from == "props":
        props = {"chat_template": "", "total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
        server.route(*PROPS, json_reply(props))
    client = client_kind.client_for(
        server, expect=n_ctx_from == "expect", retry={"attempts": 1, "delays_ms": []}, liveness_ms=150
    )

    started = time.monotonic()
    with pytest.raises(Stalled):
        client.chat(REQ, lambda event: None)
    elapsed = time.monotonic() - started

    # 4 events reach 4096 (80 ms), then 150 ms of progress that advances nothing.
    assert elapsed < 1.0, f"stalled only after {elapsed:.2f} s"
