"""Many sessions at once through an inferproxy of default limits (burst 10, 2 a second, 8 at
once), against the real llama-server: with the cache prediction on, each turn makes three or
four connections, yet the proxy refuses none of ours and no turn is retried: every connect took
its turn under the client's budget. Sessions are threads sharing one blocking client, or tasks
on one event loop sharing one `AsyncClient`, as a daemon's are."""

from __future__ import annotations

import asyncio
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
ASYNC_SESSIONS, ASYNC_TURNS = 8, 2  # the goal: eight at once through a default proxy


@pytest.fixture
def proxy_lines(tools_server: llama.LlamaServer) -> Iterator[tuple[ProxyProcess, io.StringIO]]:
    lines = io.StringIO()
    with ProxyProcess(f"{tools_server.host}:{tools_server.port}", echo=lines) as proxy:  # its own limits
        yield proxy, lines


def test_sessions_with_the_prediction_on_meet_no_refusal_and_no_retry(
    proxy_lines: tuple[ProxyProcess, io.StringIO],
) -> None:
    proxy, lines = proxy_lines
    client = Container(config=parse_config(config_on(proxy))).client()
    events: list[ChatEvent] = []
    done: list[Completion] = []
    failures: list[BaseException] = []

    def session(n: int) -> None:
        history: list[ChatMessage] = [rules()]
        try:
            for turn in range(TURNS):
                history.append(UserMessage(f"Session {n}, turn {turn}: say a colour."))
                req = ChatRequest(slot=n % llama.SLOTS, messages=history)
                completion = client.chat_with_retry(req, events.append)
                history.append(AssistantMessage(completion.content))
                done.append(completion)
        except BaseException as exc:  # reported below, with the proxy's lines
            failures.append(exc)

    threads = [threading.Thread(target=session, args=(n,)) for n in range(SESSIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)

    check(lines, failures, done, events, SESSIONS)


def test_eight_asyncio_sessions_on_one_loop_meet_no_refusal_no_retry_and_no_deadlock(
    proxy_lines: tuple[ProxyProcess, io.StringIO],
) -> None:
    # eight sessions, each holding its connection made ahead while another's prediction runs:
    # a budget as large as the proxy's own would deadlock here, or be refused
    proxy, lines = proxy_lines
    client = Container(config=parse_config(config_on(proxy))).async_client()
    events: list[ChatEvent] = []
    done: list[Completion] = []
    failures: list[BaseException] = []

    async def session(n: int) -> None:
        history: list[ChatMessage] = [rules()]
        try:
            for turn in range(ASYNC_TURNS):
                history.append(UserMessage(f"Session {n}, turn {turn}: say a colour."))
                req = ChatRequest(slot=n % llama.SLOTS, messages=history)
                completion = await client.chat_with_retry(req, events.append)
                history.append(AssistantMessage(completion.content))
                done.append(completion)
        except BaseException as exc:  # reported below, with the proxy's lines
            failures.append(exc)

    async def sessions() -> None:
        async with asyncio.timeout(300):
            await asyncio.gather(*(session(n) for n in range(ASYNC_SESSIONS)))

    asyncio.run(sessions())
    check(lines, failures, done, events, ASYNC_SESSIONS, ASYNC_TURNS)


def config_on(proxy: ProxyProcess) -> dict[str, Any]:
    return {
        "socket": proxy.socket_path,
        "model": llama.ALIAS,
        "limits": {"max_tokens": 8, "poll_ms": 2000},
        "sampling": SAMPLING,
        "cache": {"predict": True},
    }


def check(
    lines: io.StringIO,
    failures: list[BaseException],
    done: list[Completion],
    events: list[ChatEvent],
    sessions: int,
    turns: int = TURNS,
) -> None:
    refused = [line for line in lines.getvalue().splitlines() if "refused" in line]
    assert failures == [], (failures, refused)
    assert len(done) == sessions * turns
    assert refused == [], "the proxy refused a connection of ours"
    assert [e for e in events if isinstance(e, Retrying)] == []
