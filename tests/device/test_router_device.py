"""The brief's deployment: a llama-server router (`llama.ROUTER_TOOLS` and `llama.ROUTER_THINKING`,
two models of the small model's file, `--models-max 1`), through a real `inferproxy`. The info
calls never load a model, a chat loads its own with typed waits, the thinking budget holds, a
stream survives its proxy being killed, a cancel stops the generation, the cache prediction is
exact, the self-test passes through a proxy of default limits, a checkpoint brings a session back
after the other model took its place, and an answer an unload cut is named for it and sent again.
Over both clients.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama
import pytest
from proxy import ProxyProcess
from relay import Relay
from test_prompt_cache_device import ASK, NEXT, answer, long_rules, prediction_of, rules, turn
from test_resume_device import STORY, decoded_once_idle
from test_selftest_device import run_selftest, write_config
from test_through_proxy import QUESTION, SAMPLING, make_client, nonstream_answer

from app.client import Client
from app.config import parse_config
from app.container import Container
from client_support import SYNC, Kind
from domain.cancel import CancelToken
from domain.errors import Cancelled, ModelNotLoaded
from domain.events import ChatEvent, Content, ModelWait, Retrying, Waiting
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


def client_on(proxy: ProxyProcess, kind: Kind, model: str, *, predict: bool = False, **limits: Any) -> Client:
    config: dict[str, Any] = {
        "cache": {"predict": predict},
        "socket": proxy.socket_path,
        "model": model,
        "limits": {"max_tokens": 24, "poll_ms": 100, "liveness_ms": 180_000, **limits},
        "retry": {"attempts": 1, "delays_ms": []},
        "sampling": SAMPLING,
        "proxy": {"burst": 100, "rate": 100},  # the proxy's own, lifted (the fixture's flags)
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
    # Probes of 300 ms: a busy machine can keep the router from answering one within 100 ms.
    client = client_on(proxy, client_kind, llama.ROUTER_TOOLS, poll_ms=300)

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
    assert cold.timings.total >= 2900, cold.timings  # about 3,000: the tag tokenizes variously
    checkpoint = client.save_slot(0)
    assert checkpoint is not None and checkpoint.tokens >= 2900
    swap_to(router_server, llama.ROUTER_THINKING)  # another daemon's model: ours unloaded

    warm, events, warm_s = turn(client, [rules, ASK, answer(cold), NEXT])

    prediction = prediction_of(events)
    assert prediction.restored == checkpoint.tokens, prediction
    assert warm.timings.cache_n >= checkpoint.tokens - LOSS, (warm.timings, checkpoint)
    assert warm_s <= 0.2 * cold_s, f"first token {warm_s:.2f} s after the swap, {cold_s:.2f} s cold"


def unload(server: llama.LlamaServer, model: str) -> None:
    """Unload `model` (if loaded) and wait until the router says so."""
    if status(server, model) != "unloaded":
        code, reply = server.post_json("/models/unload", {"model": model})
        assert code == 200, reply
    deadline = time.monotonic() + 60
    while status(server, model) != "unloaded":
        assert time.monotonic() < deadline, f"{model} is still loaded"
        time.sleep(0.05)


@pytest.fixture
def relay(router_server: llama.LlamaServer) -> Iterator[Relay]:
    with Relay(router_server.host, router_server.port) as relay:
        yield relay


def test_a_stream_survives_its_proxy_being_killed_and_restarted_on_a_router(
    router_server: llama.LlamaServer, relay: Relay, client_kind: Kind
) -> None:
    relay.hold_at_content = True  # the stream waits at its first content for the kill
    with ProxyProcess(f"127.0.0.1:{relay.port}") as proxy:
        client = make_client(proxy.socket_path, max_tokens=200, model=llama.ROUTER_TOOLS, kind=client_kind)
        req = ChatRequest(slot=0, messages=QUESTION)
        events: list[ChatEvent] = []

        def on_event(event: ChatEvent) -> None:
            events.append(event)
            if isinstance(event, Content) and not proxy_killed:
                proxy_killed.append(True)
                proxy.kill()  # SIGKILL mid-stream
                relay.released.set()  # the rest of the answer meets the dead proxy's connection
                proxy.start()

        proxy_killed: list[bool] = []
        completion = client.chat_with_retry(req, on_event)
        expected = nonstream_answer(router_server, client, req)

    assert proxy_killed
    assert [r for r in relay.requests if r.startswith("POST ")] == ["POST /v1/chat/completions"]
    assert any(r.startswith("GET /v1/stream?conv_id=") for r in relay.requests), relay.requests
    assert completion.content == expected["content"]
    assert "".join(e.text for e in events if isinstance(e, Content)) == completion.content


def test_a_cancel_stops_the_generation_on_the_router(
    router_server: llama.LlamaServer, relay: Relay, client_kind: Kind
) -> None:
    with ProxyProcess(f"127.0.0.1:{relay.port}") as proxy:
        client = make_client(proxy.socket_path, max_tokens=2000, model=llama.ROUTER_TOOLS, kind=client_kind)
        token = CancelToken()

        def on_event(event: ChatEvent) -> None:
            if isinstance(event, Content):
                token.cancel()

        with pytest.raises(Cancelled):
            client.chat(STORY, on_event, cancel=token)
        decoded = decoded_once_idle(router_server, 0, f"/slots?model={llama.ROUTER_TOOLS}&autoload=false")

    assert any(r.startswith("DELETE /v1/stream?conv_id=") for r in relay.requests), relay.requests
    assert decoded < 1000, f"stopped, not run on to 2000 tokens: {decoded} generated"


def test_a_turn_that_extends_the_last_one_is_predicted_exactly_on_a_router(
    router_server: llama.LlamaServer, proxy: ProxyProcess, client_kind: Kind
) -> None:
    client = client_on(proxy, client_kind, llama.ROUTER_TOOLS, predict=True, cache_loss_tokens=LOSS)
    system = rules()
    first, _, _ = turn(client, [system, ASK])

    second, events, _ = turn(client, [system, ASK, answer(first), NEXT])

    prediction = prediction_of(events)
    assert not prediction.lost, prediction
    assert prediction.reused == second.timings.cache_n, (prediction, second.timings)


def test_the_selftest_passes_on_a_router_through_a_default_proxy_with_the_model_unloaded(
    router_server: llama.LlamaServer, tmp_path: Path
) -> None:
    _, props = router_server.get_json(f"/props?model={llama.ROUTER_TOOLS}")  # loads it once, for its template
    sha = hashlib.sha256(props["chat_template"].encode("utf-8")).hexdigest()
    unload(router_server, llama.ROUTER_TOOLS)
    with ProxyProcess(f"{router_server.host}:{router_server.port}") as proxy:  # the proxy's own limits
        config = write_config(tmp_path / "router.toml", proxy.socket_path, sha=sha, model=llama.ROUTER_TOOLS)
        code, lines, _ = run_selftest(config)

    assert code == 0, "\n".join(lines)
    assert [line.split()[0] for line in lines] == ["ok", "ok", "ok", "ok"], lines


def test_an_answer_an_unload_cut_is_named_for_the_unload_and_sent_again(
    router_server: llama.LlamaServer, proxy: ProxyProcess, client_kind: Kind
) -> None:
    client = make_client(
        proxy.socket_path,
        max_tokens=400,
        model=llama.ROUTER_TOOLS,
        kind=client_kind,
        limits={"liveness_ms": 60_000},
    )
    events: list[ChatEvent] = []
    unloading: list[threading.Thread] = []

    def on_event(event: ChatEvent) -> None:
        events.append(event)
        if isinstance(event, Content) and not unloading:
            unloading.append(
                threading.Thread(target=router_server.post_json, args=("/models/unload", {"model": llama.ROUTER_TOOLS}))
            )
            unloading[0].start()

    completion = client.chat_with_retry(STORY, on_event)
    unloading[0].join(30)

    resend = [e for e in events if isinstance(e, Retrying) and e.resend]
    assert resend, [e for e in events if isinstance(e, Retrying)]
    assert "the router unloaded the model mid-answer" in resend[0].error, resend[0]
    assert completion.finish_reason is not None


def test_a_chat_behind_another_models_answer_waits_as_behind_not_as_a_stuck_server(
    router_server: llama.LlamaServer, proxy: ProxyProcess, client_kind: Kind
) -> None:
    swap_to(router_server, llama.ROUTER_THINKING)
    other = client_on(proxy, SYNC, llama.ROUTER_THINKING, max_tokens=300)
    story = ChatRequest(slot=0, messages=[UserMessage(llama.LONG_STORY_PROMPT)], thinking=False)
    started = threading.Event()

    def seen(event: ChatEvent) -> None:
        if isinstance(event, Content):
            started.set()

    running = threading.Thread(target=lambda: other.chat(story, seen))
    running.start()
    try:
        assert started.wait(60), "the other model's answer began"
        # Probes of 500 ms: a busy machine can keep the router from answering within 100 ms,
        # which is a stuck server as far as the probe can tell.
        client = client_on(proxy, client_kind, llama.ROUTER_TOOLS, poll_ms=500)
        events: list[Any] = []
        completion = client.chat(ChatRequest(slot=1, messages=[UserMessage("Say hi.")]), events.append)
    finally:
        running.join(120)

    assert completion.content
    waits = [e for e in events if isinstance(e, Waiting)]
    assert any(w.model is ModelWait.BEHIND for w in waits), waits
    assert not any(w.unresponsive for w in waits), "a wait behind another model is no stuck server"
