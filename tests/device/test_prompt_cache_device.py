"""The cache prediction and the slot checkpoints against the real llama-server, through a real
`inferproxy`: each prediction is checked against the `cache_n` the server then reports, in the
four cases that matter (a turn that extends the last one, a changed system prompt, reasoning the
Qwen3.5 template drops, a slot a unified KV cache emptied), and a 3,000-token session survives a
server restart by its checkpoint, restored by the client on its own.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama
import pytest
from proxy import ProxyProcess
from test_through_proxy import SAMPLING

from app.client import Client
from app.config import parse_config
from app.container import Container
from client_support import Kind
from domain.completion import Completion
from domain.events import CacheCause, CachePrediction, ChatEvent, Content, Reasoning
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, SystemMessage, UserMessage

pytestmark = pytest.mark.device

LOSS = 64
# Exact on this server in every run so far: 0 tokens off, or the answer's last token.
PREDICTION_ERROR = 2
ASK = UserMessage("Name one colour of the sky.")
NEXT = UserMessage("Now name one colour of grass.")


def rules(text: str = "You are a terse assistant. Answer in one short sentence. ") -> SystemMessage:
    """A system prompt no earlier request sent: the server's RAM prompt cache (`--cache-ram`) may
    hand a slot a prompt it saw before, more than the slot held, which no client can see."""
    return SystemMessage(f"Session {secrets.token_hex(4)}. " + text * 6)


def client_on(
    socket_path: str, kind: Kind, *, predict: bool = True, max_tokens: int = 24, liveness_ms: int = 30_000
) -> Client:
    config: dict[str, Any] = {
        "socket": socket_path,
        "model": llama.ALIAS,
        "limits": {"max_tokens": max_tokens, "poll_ms": 500, "cache_loss_tokens": LOSS, "liveness_ms": liveness_ms},
        "retry": {"attempts": 4, "delays_ms": [100, 200, 400], "jitter": 0.0, "total_ms": 60_000},
        "sampling": SAMPLING,
        "cache": {"predict": predict},
    }
    return kind.client_of(Container(config=parse_config(config)))


def turn(
    client: Client, messages: list[ChatMessage], *, slot: int = 0, thinking: bool = False
) -> tuple[Completion, list[ChatEvent], float]:
    """A chat: its completion, its events, and the seconds from the call to its first token."""
    events: list[ChatEvent] = []
    first: list[float] = []
    started = time.monotonic()

    def seen(event: ChatEvent) -> None:
        events.append(event)
        if not first and isinstance(event, Content | Reasoning):
            first.append(time.monotonic() - started)

    completion = client.chat(ChatRequest(slot=slot, messages=messages, thinking=thinking), seen)
    return completion, events, first[0] if first else time.monotonic() - started


def prediction_of(events: list[ChatEvent]) -> CachePrediction:
    [prediction] = [e for e in events if isinstance(e, CachePrediction)]
    return prediction


def answer(completion: Completion) -> AssistantMessage:
    return AssistantMessage(completion.content, completion.reasoning_content, tuple(completion.tool_calls))


@pytest.fixture
def proxy_to(request: pytest.FixtureRequest) -> Iterator[Any]:
    opened: list[ProxyProcess] = []

    def start(server: llama.LlamaServer) -> ProxyProcess:
        proxy = ProxyProcess(f"{server.host}:{server.port}").start()
        opened.append(proxy)
        return proxy

    yield start
    for proxy in opened:
        proxy.stop()


def test_a_turn_that_extends_the_last_one_is_predicted_exactly(
    tools_server: llama.LlamaServer, proxy_to: Any, client_kind: Kind
) -> None:
    client = client_on(proxy_to(tools_server).socket_path, client_kind)
    system = rules()
    first, _, _ = turn(client, [system, ASK])
    second, events, _ = turn(client, [system, ASK, answer(first), NEXT])
    prediction = prediction_of(events)
    assert abs(prediction.reused - second.timings.cache_n) <= PREDICTION_ERROR, (prediction, second.timings)
    assert not prediction.lost and prediction.previous == first.timings.total


def test_a_changed_system_prompt_is_predicted_as_a_loss_at_message_0(
    tools_server: llama.LlamaServer, proxy_to: Any, client_kind: Kind
) -> None:
    client = client_on(proxy_to(tools_server).socket_path, client_kind)
    first, _, _ = turn(client, [rules(), ASK])
    other = rules("You are a verbose assistant who likes long answers. ")
    second, events, _ = turn(client, [other, ASK, answer(first), NEXT])
    prediction = prediction_of(events)
    assert abs(prediction.reused - second.timings.cache_n) <= PREDICTION_ERROR, (prediction, second.timings)
    assert (prediction.lost, prediction.message, prediction.cause) == (True, 0, CacheCause.MESSAGE_CHANGED)


def test_reasoning_the_qwen35_template_drops_is_predicted_and_named(
    thinking_server: llama.LlamaServer, proxy_to: Any, client_kind: Kind
) -> None:
    # 120 tokens of reasoning, then the template renders that turn without it: well over the limit
    client = client_on(proxy_to(thinking_server).socket_path, client_kind, max_tokens=120)
    story = UserMessage(llama.LONG_STORY_PROMPT)
    system = rules()
    first, _, _ = turn(client, [system, story], thinking=True)
    assert first.reasoning_content, "the generation prompt opens a think block"
    second, events, _ = turn(client, [system, story, answer(first), NEXT], thinking=True)
    prediction = prediction_of(events)
    assert abs(prediction.reused - second.timings.cache_n) <= PREDICTION_ERROR, (prediction, second.timings)
    assert (prediction.lost, prediction.message, prediction.cause) == (True, 2, CacheCause.REASONING_DROPPED)


def test_a_slot_a_unified_kv_cache_emptied_is_predicted(proxy_to: Any, client_kind: Kind, tmp_path: Path) -> None:
    with llama.start_server("tools", log_dir=tmp_path, extra_args=("--kv-unified",)) as server:
        client = client_on(proxy_to(server).socket_path, client_kind)
        system = rules()
        first, _, _ = turn(client, [system, ASK])
        turn(client, [UserMessage("Hi.")], slot=1)  # another slot starts a task: ours is cleared
        second, events, _ = turn(client, [system, ASK, answer(first), NEXT])
    prediction = prediction_of(events)
    assert abs(prediction.reused - second.timings.cache_n) <= PREDICTION_ERROR, (prediction, second.timings)
    assert (prediction.lost, prediction.message, prediction.cause) == (True, None, CacheCause.SLOT_EMPTIED)


def long_rules() -> SystemMessage:
    return SystemMessage(llama.house_rules(secrets.token_hex(4)))


def test_a_restarted_server_gets_the_session_back_from_its_checkpoint(
    proxy_to: Any, client_kind: Kind, tmp_path: Path
) -> None:
    saves = tmp_path / "slots"
    server = llama.launch("tools", log_dir=tmp_path, slot_save_path=saves)
    try:
        proxy = proxy_to(server)
        # a 2,048-token prompt batch on a busy 2-core machine can take longer than the default
        # liveness limit between two progress events
        client = client_on(proxy.socket_path, client_kind, predict=False, liveness_ms=180_000)
        rules = long_rules()
        cold, _, cold_s = turn(client, [rules, ASK])
        assert cold.timings.total >= 3000, cold.timings
        checkpoint = client.save_slot(0)
        assert checkpoint is not None and checkpoint.tokens >= 3000
        assert (saves / checkpoint.filename).stat().st_size == checkpoint.bytes
        port = server.port
        server.stop()
        server = llama.launch("tools", log_dir=tmp_path, slot_save_path=saves, port=port)

        warm, events, warm_s = turn(client, [rules, ASK, answer(cold), NEXT])
    finally:
        server.stop()
    prediction = prediction_of(events)
    assert prediction.restored == checkpoint.tokens, prediction
    assert warm.timings.cache_n >= checkpoint.tokens - LOSS, (warm.timings, checkpoint)
    assert warm_s <= 0.2 * cold_s, f"first token {warm_s:.2f} s after the restart, {cold_s:.2f} s cold"
