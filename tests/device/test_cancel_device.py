"""Cancelling against the real llama-server: closing the connection is what stops the generation.

A long answer is cancelled from another thread mid-stream; right after the call returns, the
server's own `/slots` says the slot is idle again, and the next request on it completes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import llama
import pytest
from proxy import ProxyProcess
from test_through_proxy import make_client

from domain.cancel import CancelToken
from domain.errors import Cancelled
from domain.events import ChatEvent, Content, Reasoning
from domain.messages import ChatRequest, UserMessage

pytestmark = pytest.mark.device


@pytest.fixture
def proxy(thinking_server: llama.LlamaServer) -> Iterator[ProxyProcess]:
    with ProxyProcess(f"{thinking_server.host}:{thinking_server.port}") as running:
        yield running


def slot_busy(server: llama.LlamaServer, slot: int) -> bool:
    status, slots = server.get_json("/slots")
    assert status == 200, slots
    return bool(next(s for s in slots if s["id"] == slot)["is_processing"])


def test_cancel_mid_stream_returns_at_once_and_leaves_the_slot_idle(
    thinking_server: llama.LlamaServer, proxy: ProxyProcess
) -> None:
    client = make_client(proxy.socket_path, max_tokens=2000, limits={"thinking_cap": 4096})
    req = ChatRequest(slot=0, messages=[UserMessage(llama.LONG_STORY_PROMPT)], thinking=True)
    token = CancelToken()
    streaming = threading.Event()
    tokens = 0

    def on_event(event: ChatEvent) -> None:
        nonlocal tokens
        if isinstance(event, Reasoning | Content):
            tokens += 1
            if tokens == 20:
                streaming.set()

    def cancel_when_streaming() -> None:
        assert streaming.wait(60.0)
        assert slot_busy(thinking_server, 0), "the slot generates while the answer streams"
        cancelled_at.append(time.monotonic())
        token.cancel()

    cancelled_at: list[float] = []
    canceller = threading.Thread(target=cancel_when_streaming)
    canceller.start()
    with pytest.raises(Cancelled):
        client.chat(req, on_event, cancel=token)
    returned = time.monotonic()
    canceller.join(5.0)

    assert returned - cancelled_at[0] < 0.1
    # The server notices the close at its next token: well within a few hundred milliseconds.
    deadline = time.monotonic() + 2.0
    while slot_busy(thinking_server, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not slot_busy(thinking_server, 0), "the cancelled generation stopped"
    idle_after = time.monotonic() - cancelled_at[0]
    assert idle_after < 1.0
    short = ChatRequest(slot=0, messages=[UserMessage("Say hi.")], thinking=False, max_tokens=4)
    assert client.chat(short, lambda event: None).timings.predicted_n <= 4
