"""The brief's deployment: a llama-server router (`llama.ROUTER_TOOLS` and `llama.ROUTER_THINKING`,
two models of the small model's file, `--models-max 1`), through a real `inferproxy`. The info
calls never load a model, a chat loads its own with typed waits, the thinking budget holds, and a
checkpoint brings a session back after the other model took its place. Over both clients.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import llama
import pytest
from proxy import ProxyProcess
from test_prompt_cache_device import ASK, NEXT, answer, long_rules, prediction_of, turn
from test_through_proxy import SAMPLING

from app.client import Client
from app.config import parse_config
from app.container import Container
from client_support import Kind
from domain.errors import ModelNotLoaded
from domain.events import ModelWait, Waiting
from domain.messages import ChatRequest, UserMessage

pytestmark = pytest.mark.device

LOSS = 64


@pytest.fixture
def proxy(router_server: llama.LlamaServer) -> Iterator[ProxyProcess]:
    # The accept bucket lifted: these tests are of the router; a turn that waits for a load makes
    # more connections than the default burst of 10 allows in a second.
    upstream = f"{router_server.host}:{router_server.port}"
    with ProxyProcess(upstream, extra_args=("--burst", "100", "--rate", "100")) as proxy:
        yield proxy


def client_on(proxy: ProxyProcess, kind: Kind, model: str, **limits: Any) -> Client:
    config: dict[str, Any] = {
        "socket": proxy.socket_path,
        "model": model,
        "limits": {"max_tokens": 24, "poll_ms": 100, "liveness_ms": 180_000, **limits},
        "retry": {"attempts": 1, "delays_ms": []},
        "sampling": SAMPLING,
    }
    return kind.client_of(Container(config=parse_config(config)))


def status(server: llama.LlamaServer, model: str) -> str:
    _, models = server.get_json("/models")
    (entry,) = [m for m in models["data"] if m["id"] == model]
    return str(entry["status"]["value"])


def swap_to(server: llama.LlamaServer, model: str) -> None:
    """Load `model` by a request of its own (under `--models-max 1` the other one goes)."""
    code, reply = server.post_json(
        "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    )
    assert code == 200, reply
    deadline = time.monotonic() + 60
    while any(status(server, m) != "unloaded" for m in (llama.ROUTER_TOOLS, llama.ROUTER_THINKING) if m != model):
        assert time.monotonic() < deadline, "the other model is still loaded"
        time.sleep(0.05)


def test_info_calls_never_load_a_model_and_a_chat_loads_its_own_with_typed_waits(
    router_server: llama.LlamaServer, proxy: ProxyProcess, client_kind: Kind
) -> None:
    swap_to(router_server, llama.ROUTER_THINKING)
    client = client_on(proxy, client_kind, llama.ROUTER_TOOLS)

    for call in (client.props, client.slots, lambda: client.tokenize("hi")):
        with pytest.raises(ModelNotLoaded):
            call()
    assert status(router_server, llama.ROUTER_TOOLS) == "unloaded"
    assert status(router_server, llama.ROUTER_THINKING) == "loaded", "nothing of ours evicted it"

    events: list[Any] = []
    completion = client.chat(ChatRequest(slot=0, messages=[UserMessage("Say hi.")]), events.append)

    assert completion.content
    assert status(router_server, llama.ROUTER_TOOLS) == "loaded"
    waits = [e for e in events if isinstance(e, Waiting)]
    assert not any(w.unresponsive for w in waits), "a load is not a paused or stuck server"
    assert any(w.model in (ModelWait.LOADING, ModelWait.BEHIND) for w in waits), waits


def test_the_thinking_budget_holds_through_the_router(
    router_server: llama.LlamaServer, proxy: ProxyProcess, client_kind: Kind
) -> None:
    client = client_on(proxy, client_kind, llama.ROUTER_THINKING, thinking_cap=16, max_tokens=120)
    events: list[Any] = []
    req = ChatRequest(slot=0, messages=[UserMessage(llama.LONG_STORY_PROMPT)], thinking=True)

    completion = client.chat(req, events.append)

    assert completion.thinking_capped
    assert completion.reasoning_tokens <= 16 + 2


def test_a_checkpoint_brings_a_session_back_after_the_other_model_took_its_place(
    router_server: llama.LlamaServer, proxy: ProxyProcess, client_kind: Kind
) -> None:
    client = client_on(proxy, client_kind, llama.ROUTER_TOOLS, cache_loss_tokens=LOSS)
    rules = long_rules()
    cold, _, cold_s = turn(client, [rules, ASK])
    assert cold.timings.total >= 3000, cold.timings
    checkpoint = client.save_slot(0)
    assert checkpoint is not None and checkpoint.tokens >= 3000
    swap_to(router_server, llama.ROUTER_THINKING)  # another daemon's model: ours unloaded

    warm, events, warm_s = turn(client, [rules, ASK, answer(cold), NEXT])

    prediction = prediction_of(events)
    assert prediction.restored == checkpoint.tokens, prediction
    assert warm.timings.cache_n >= checkpoint.tokens - LOSS, (warm.timings, checkpoint)
    assert warm_s <= 0.2 * cold_s, f"first token {warm_s:.2f} s after the swap, {cold_s:.2f} s cold"
