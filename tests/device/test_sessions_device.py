"""Many sessions at once through an inferproxy of default limits (burst 10, 2 a second, 8 at
once), against the real llama-server: with the cache prediction on, each turn makes three or
four connections, yet the proxy refuses none of ours and no turn is retried: every connect took
its turn under the client's budget. Sessions are threads sharing one client, as a daemon's are."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from typing import Any

import llama
import pytest
from proxy import ProxyProcess
from test_prompt_cache_device import rules
from test_through_proxy import SAMPLING

from app.config import parse_config
from app.container import Container
from domain.completion import Completion
from domain.events import ChatEvent, Retrying
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, UserMessage

pytestmark = pytest.mark.device

SESSIONS = 4
TURNS = 3


@pytest.fixture
def proxy_lines(tools_server: llama.LlamaServer) -> Iterator[tuple[ProxyProcess, io.StringIO]]:
    lines = io.StringIO()
    with ProxyProcess(f"{tools_server.host}:{tools_server.port}", echo=lines) as proxy:  # its own limits
        yield proxy, lines


def test_sessions_with_the_prediction_on_meet_no_refusal_and_no_retry(
    proxy_lines: tuple[ProxyProcess, io.StringIO],
) -> None:
    proxy, lines = proxy_lines
    config: dict[str, Any] = {
        "socket": proxy.socket_path,
        "model": llama.ALIAS,
        "limits": {"max_tokens": 8, "poll_ms": 2000},
        "sampling": SAMPLING,
        "cache": {"predict": True},
    }
    client = Container(config=parse_config(config)).client()
    events: list[ChatEvent] = []
    done: list[Completion] = []
    failures: list[BaseException] = []

    def session(n: int) -> None:
        history: list[ChatMessage] = [rules()]
        try:
            for turn in range(TURNS):
                history.append(UserMessage(f"Session {n}, turn {turn}: say a colour."))
                completion = client.chat_with_retry(ChatRequest(slot=n % llama.SLOTS, messages=history), events.append)
                history.append(AssistantMessage(completion.content))
                done.append(completion)
        except BaseException as exc:  # reported below, with the proxy's lines
            failures.append(exc)

    threads = [threading.Thread(target=session, args=(n,)) for n in range(SESSIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)

    refused = [line for line in lines.getvalue().splitlines() if "refused" in line]
    assert failures == [], (failures, refused)
    assert len(done) == SESSIONS * TURNS
    assert refused == [], "the proxy refused a connection of ours"
    assert [e for e in events if isinstance(e, Retrying)] == []
