"""The exact thinking cap on the real llama-server: a thinking request carries
`thinking_budget_tokens = thinking_cap`, the server ends the thinking block at exactly that many
tokens, and the client emits `ThinkingCapped` there without posting `reasoning_end` (a relay
between the proxy and the server sees every request it received). Over several caps, both
clients."""

from __future__ import annotations

from collections.abc import Iterator

import llama
import pytest
from proxy import ProxyProcess
from relay import Relay
from test_through_proxy import make_client

from client_support import Kind
from domain.events import ChatEvent, Content, Reasoning, ThinkingCapped
from domain.messages import ChatRequest, UserMessage

pytestmark = pytest.mark.device


@pytest.fixture
def relayed_thinking(thinking_server: llama.LlamaServer) -> Iterator[tuple[Relay, ProxyProcess]]:
    with Relay(thinking_server.host, thinking_server.port) as relay, ProxyProcess(f"127.0.0.1:{relay.port}") as proxy:
        yield relay, proxy


@pytest.mark.parametrize("cap", [8, 24, 40])
def test_the_server_ends_the_thinking_block_at_exactly_the_cap_and_no_control_call_is_made(
    relayed_thinking: tuple[Relay, ProxyProcess], client_kind: Kind, cap: int
) -> None:
    relay, proxy = relayed_thinking
    client = make_client(
        proxy.socket_path, max_tokens=cap + 48, limits={"thinking_cap": cap, "thinking_overrun": 64}, kind=client_kind
    )
    req = ChatRequest(slot=0, messages=[UserMessage(llama.LONG_STORY_PROMPT)], thinking=True)
    events: list[ChatEvent] = []

    completion = client.chat(req, events.append)

    (capped,) = [e for e in events if isinstance(e, ThinkingCapped)]
    print(f"cap {cap}: reasoning ended at {capped.tokens} tokens")
    assert capped.tokens == cap, "exactly at the budget"
    assert completion.thinking_capped and completion.reasoning_tokens == cap
    at = events.index(capped)
    assert isinstance(events[at - 1], Reasoning)
    assert not any(isinstance(e, Reasoning) for e in events[at:]), "no reasoning after the cap"
    assert any(isinstance(e, Content) for e in events[at:]) or completion.content
    assert not any("/control" in r for r in relay.requests), relay.requests
