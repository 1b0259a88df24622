"""The client against the real llama-server, through a real `inferproxy` process.

These are the brief's on-device tests: a capped thinking block, a stream that survives its proxy
being SIGKILLed mid-stream and restarted, a busy-slot wait, a prompt over the context, the props /
slots / tokenize answers, and a streamed answer equal to the server's own non-stream answer. They
use slot 0 and never kill the llama-server itself. The capped thinking block and the killed proxy
run over both clients (`client_kind`): the sync `Client` and the `AsyncClient`.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import llama
import pytest
from proxy import ProxyProcess

from app.client import Client
from app.config import parse_config
from app.container import Container
from client_support import SYNC, Kind
from domain.completion import Completion, FinishReason
from domain.errors import HttpError
from domain.events import ChatEvent, Content, Progress, Reasoning, Retrying, ThinkingCapped, Waiting
from domain.messages import ChatRequest, SystemMessage, UserMessage

pytestmark = pytest.mark.device

SAMPLING = {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": 42}
QUESTION = [SystemMessage("You are a helpful assistant."), UserMessage("Name three colours of the rainbow.")]


def make_client(
    socket_path: str,
    *,
    max_tokens: int = 48,
    limits: dict[str, Any] | None = None,
    retry: dict[str, Any] | None = None,
    model: str = llama.ALIAS,
    kind: Kind = SYNC,
) -> Client:
    config = parse_config(
        {
            "socket": socket_path,
            "model": model,
            "limits": {"max_tokens": max_tokens, "poll_ms": 200, **(limits or {})},
            "retry": retry or {"attempts": 4, "delays_ms": [100, 200, 400], "jitter": 0.25, "total_ms": 60_000},
            "sampling": SAMPLING,
        }
    )
    return kind.client_of(Container(config=config))


def nonstream_answer(server: llama.LlamaServer, client: Client, req: ChatRequest) -> dict[str, Any]:
    """The server's own answer to the very body the client sends, with `stream: false`."""
    body = json.loads(client.render(req))
    body["stream"] = False
    status, answer = server.post_json("/v1/chat/completions", body)
    assert status == 200, answer
    message: dict[str, Any] = answer["choices"][0]["message"]
    return message


@pytest.fixture
def tools_proxy(tools_server: llama.LlamaServer) -> Iterator[ProxyProcess]:
    with ProxyProcess(f"{tools_server.host}:{tools_server.port}") as proxy:
        yield proxy


@pytest.fixture
def thinking_proxy(thinking_server: llama.LlamaServer) -> Iterator[ProxyProcess]:
    with ProxyProcess(f"{thinking_server.host}:{thinking_server.port}") as proxy:
        yield proxy


def test_streamed_answer_through_the_proxy_equals_the_servers_nonstream_answer(
    tools_server: llama.LlamaServer, tools_proxy: ProxyProcess
) -> None:
    client = make_client(tools_proxy.socket_path)
    req = ChatRequest(slot=0, messages=QUESTION)
    events: list[ChatEvent] = []
    completion = client.chat(req, events.append)
    expected = nonstream_answer(tools_server, client, req)
    assert completion.content == expected["content"]
    assert completion.content == "".join(e.text for e in events if isinstance(e, Content))
    assert completion.finish_reason.value == "length" or completion.finish_reason is FinishReason.STOP
    assert any(isinstance(e, Progress) for e in events)
    assert completion.timings.predicted_n > 0
    assert completion.id.startswith("chatcmpl-")


def test_props_slots_and_tokenize_match_the_real_answers(
    tools_server: llama.LlamaServer, tools_proxy: ProxyProcess
) -> None:
    client = make_client(tools_proxy.socket_path)
    _, props = tools_server.get_json("/props")
    got = client.props()
    assert got.chat_template == props["chat_template"]
    assert got.chat_template_sha256 == hashlib.sha256(props["chat_template"].encode()).hexdigest()
    assert (got.total_slots, got.n_ctx) == (llama.SLOTS, llama.SLOT_CONTEXT)
    assert [s.id for s in client.slots()] == list(range(llama.SLOTS))
    status, tokens = tools_server.post_json("/tokenize", {"content": "Hello, lighthouse!", "with_pieces": True})
    assert status == 200
    assert [(t.id, t.piece) for t in client.tokenize("Hello, lighthouse!")] == [
        (t["id"], t["piece"]) for t in tokens["tokens"]
    ]


def test_prompt_over_the_slot_context_is_http_400_with_the_servers_message(tools_proxy: ProxyProcess) -> None:
    client = make_client(tools_proxy.socket_path, retry={"attempts": 1, "delays_ms": []})
    req = ChatRequest(slot=0, messages=[UserMessage("lighthouse " * 6000)])
    with pytest.raises(HttpError) as info:
        client.chat_with_retry(req, lambda e: None)
    assert info.value.status == 400
    assert "exceeds the available context size" in info.value.body
    assert json.loads(info.value.body)["error"]["type"] == "exceed_context_size_error"


def test_runaway_thinking_is_capped_and_the_answer_completes(thinking_proxy: ProxyProcess, client_kind: Kind) -> None:
    client = make_client(
        thinking_proxy.socket_path,
        max_tokens=160,
        limits={"thinking_cap": 12, "thinking_overrun": 64},
        kind=client_kind,
    )
    req = ChatRequest(slot=0, messages=[UserMessage(llama.LONG_STORY_PROMPT)], thinking=True)
    events: list[ChatEvent] = []
    completion = client.chat(req, events.append)
    capped = [e for e in events if isinstance(e, ThinkingCapped)]
    assert len(capped) == 1
    assert capped[0].tokens >= 12
    assert completion.thinking_capped
    assert completion.reasoning_content
    assert 12 <= completion.reasoning_tokens <= 12 + 64
    # After the cap, the model left its thinking block: what followed is answer, not reasoning.
    after = events[events.index(capped[0]) + 1 :]
    assert any(isinstance(e, Content) for e in after) or completion.finish_reason is FinishReason.STOP


def test_a_second_request_on_a_busy_slot_waits_and_then_completes(thinking_proxy: ProxyProcess) -> None:
    first_client = make_client(thinking_proxy.socket_path, max_tokens=120, limits={"thinking_cap": 4096})
    # Probes of 500 ms: a server busy generating, on a busy machine, can take over 100 ms to
    # answer `/slots`, which the probe must take for a stuck server.
    second_client = make_client(thinking_proxy.socket_path, max_tokens=8, limits={"poll_ms": 500})
    started = threading.Event()
    first_result: list[Completion | BaseException] = []

    def first_events(event: ChatEvent) -> None:
        if isinstance(event, Reasoning | Content):
            started.set()

    def run_first() -> None:
        try:
            first_result.append(
                first_client.chat(
                    ChatRequest(slot=0, messages=[UserMessage(llama.LONG_STORY_PROMPT)], thinking=True), first_events
                )
            )
        except BaseException as exc:
            first_result.append(exc)
            started.set()

    worker = threading.Thread(target=run_first)
    worker.start()
    try:
        assert started.wait(120), "the first request never started streaming"
        events: list[ChatEvent] = []
        completion = second_client.chat(ChatRequest(slot=0, messages=QUESTION), events.append)
    finally:
        worker.join(180)
    assert isinstance(first_result[0], Completion), first_result
    waits = [e for e in events if isinstance(e, Waiting)]
    assert waits and waits[0] == Waiting(slot_busy=True)
    assert completion.timings.predicted_n > 0
    # Every Waiting came before the first data event of the answer.
    first_data = next(i for i, e in enumerate(events) if not isinstance(e, Waiting))
    assert all(isinstance(e, Waiting) for e in events[:first_data])


def test_stream_survives_its_proxy_being_killed_mid_stream_and_restarted(
    tools_server: llama.LlamaServer, tools_proxy: ProxyProcess, client_kind: Kind
) -> None:
    client = make_client(tools_proxy.socket_path, max_tokens=40, kind=client_kind)
    req = ChatRequest(slot=0, messages=QUESTION)
    events: list[ChatEvent] = []
    killed: list[bool] = []

    def on_event(event: ChatEvent) -> None:
        events.append(event)
        if isinstance(event, Content) and not killed:
            killed.append(True)
            tools_proxy.kill()  # SIGKILL mid-stream: the socket file is left stale
            tools_proxy.start()  # the new proxy removes the stale socket and listens again

    completion = client.chat_with_retry(req, on_event)
    retries = [e for e in events if isinstance(e, Retrying)]
    assert killed and len(retries) == 1
    assert retries[0].attempt == 2
    assert "StreamClosedEarly" in retries[0].error
    expected = nonstream_answer(tools_server, client, req)
    assert completion.content == expected["content"]
    # The retry re-attached to the server's replay: the deltas before and after it make the
    # content once, none repeated (`test_resume_device` counts the requests the server saw).
    assert "".join(e.text for e in events if isinstance(e, Content)) == completion.content


def test_proxy_forwards_a_real_streamed_answer_byte_exactly(tools_server: llama.LlamaServer) -> None:
    """A recording relay between the proxy and the server keeps what the server sent; the client
    side of the proxy must receive exactly those bytes."""
    upstream_bytes = bytearray()
    listener = socket.create_server(("127.0.0.1", 0))
    relay_port = listener.getsockname()[1]

    def relay() -> None:
        conn, _ = listener.accept()
        with conn, socket.create_connection((tools_server.host, tools_server.port)) as up:
            request = bytearray()
            while b"\r\n\r\n" not in request or len(request) < request.find(b"\r\n\r\n") + 4 + body_len:
                piece = conn.recv(65536)
                if not piece:
                    break
                request += piece
            up.sendall(request)
            while True:
                piece = up.recv(65536)
                if not piece:
                    break
                upstream_bytes.extend(piece)
                conn.sendall(piece)

    body = json.dumps(
        {
            "model": llama.ALIAS,
            "messages": [{"role": "user", "content": "Say hello."}],
            "stream": True,
            "max_tokens": 24,
            **SAMPLING,
        }
    ).encode()
    body_len = len(body)
    thread = threading.Thread(target=relay)
    thread.start()
    try:
        with ProxyProcess(f"127.0.0.1:{relay_port}") as proxy:
            client_side = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client_side.settimeout(120)
            client_side.connect(proxy.socket_path)
            client_side.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (body_len, body)
            )
            received = bytearray()
            while True:
                piece = client_side.recv(65536)
                if not piece:
                    break
                received += piece
            client_side.close()
    finally:
        thread.join(60)
        listener.close()
    assert received.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" in received
    assert bytes(received) == bytes(upstream_bytes)


def model_state(server: llama.LlamaServer, model: str) -> str:
    _, models = server.get_json("/models")
    states = {m["id"]: m["status"]["value"] for m in models["data"]}
    return str(states[model])


def test_router_reloads_an_unloaded_model_while_the_chat_waits(router_server: llama.LlamaServer) -> None:
    """The brief's upstream as it is: a router. After `/models/unload`, a chat through the proxy
    is held by the router while it loads the model again, and completes.

    Pinned: the router answers `GET /slots?model=M` for an unloaded model by loading it
    (autoload), and holds a chat for it until the load is done; it never answers 503 here."""
    model = llama.ROUTER_MODEL
    with ProxyProcess(f"{router_server.host}:{router_server.port}") as proxy:
        client = make_client(proxy.socket_path, model=model, max_tokens=8, limits={"poll_ms": 100})
        warm = client.chat(ChatRequest(slot=0, messages=QUESTION), lambda e: None)
        assert warm.timings.predicted_n > 0
        status, answer = router_server.post_json("/models/unload", {"model": model})
        assert (status, answer) == (200, {"success": True})
        # The unload answers at once and completes in the background: wait until /models says so.
        deadline = time.monotonic() + 60
        while model_state(router_server, model) != "unloaded":
            assert time.monotonic() < deadline, f"model still {model_state(router_server, model)} after 60 s"
            time.sleep(0.05)
        events: list[ChatEvent] = []
        completion = client.chat(ChatRequest(slot=0, messages=QUESTION), events.append)
        assert completion.content
        assert completion.content == warm.content  # temperature 0: the reloaded model answers alike
        assert model_state(router_server, model) == "loaded"
        # Any wait seen while the model loaded was reported as Waiting, never as an error.
        assert all(isinstance(e, Waiting | Progress | Content | Reasoning) for e in events)
