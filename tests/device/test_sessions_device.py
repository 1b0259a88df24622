"""Many sessions at once through an inferproxy of default limits (burst 10, 2 a second, 8 at
once), against the real llama-server: with the cache prediction on, each turn makes three or
four connections, yet the proxy refuses none of ours and no turn is retried: every connect took
its turn under the client's budget. Sessions are threads sharing one blocking client, or tasks
on one event loop sharing one `AsyncClient`, as a daemon's are."""

from __future__ import annotations

import asyncio
import io
import logging
import socket
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
from client_support import Kind
from domain.completion import Completion
from domain.events import ChatEvent, Retrying
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, UserMessage

pytestmark = pytest.mark.device

NEXT = UserMessage("Say a colour.")
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


def test_a_refusal_of_a_proxy_another_process_shares_is_tried_again_after_its_refill(
    tools_server: llama.LlamaServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    # Another process spends the proxy's one token: a connect of the turn's is refused, tried
    # again after the refill time (not the 2 s of an outage), and the real server answers.
    lines = io.StringIO()
    upstream = f"{tools_server.host}:{tools_server.port}"
    with ProxyProcess(upstream, extra_args=("--burst", "1", "--rate", "2"), echo=lines) as proxy:
        config = {**config_on(proxy), "proxy": {"burst": 1, "rate": 2}}
        client = client_kind.client_of(Container(config=parse_config(config)))
        another_process = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        another_process.connect(proxy.socket_path)
        another_process.close()
        events: list[ChatEvent] = []
        with caplog.at_level(logging.INFO, logger="inferpath.client"):
            completion = client.chat(ChatRequest(slot=0, messages=[rules(), NEXT]), events.append)

    assert completion.content
    said = [r.getMessage() for r in caplog.records if "refused by the proxy" in r.getMessage()]
    resent = [e for e in events if isinstance(e, Retrying) and e.error.startswith("ProxyRefused")]
    assert said or resent, "a connect of ours was refused, and tried again"
    assert all("tried again in 526 ms" in line for line in said), said
    assert all(e.after_ms < 1000 for e in resent), "after the refill time, not an outage's 2 s"
    refused = [line for line in lines.getvalue().splitlines() if "refused" in line]
    assert refused and all("accept rate" in line for line in refused), refused
