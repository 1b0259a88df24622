"""A turn survives a cut stream on the real llama-server: the client re-attaches to the server's
replay of the body (`X-Conversation-Id`, `GET /v1/stream?conv_id=ID&from=N`) instead of sending
the request again, and a call that ends early stops the generation (`DELETE /v1/stream`).

A TCP relay between the proxy and the server (`relay.Relay`) sees every request line the server
receives, and can reset the first chat stream at a chosen byte. The answer is compared with the
server's own non-stream answer to the same bytes (temperature 0), so it is exact whatever the
CPU's rounding. Over both clients.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import llama
import pytest
from proxy import ProxyProcess
from relay import Relay
from test_through_proxy import QUESTION, make_client, nonstream_answer

from app.client import Client
from client_support import Kind
from domain.cancel import CancelToken
from domain.errors import Cancelled
from domain.events import ChatEvent, Content, Retrying
from domain.messages import ChatRequest, UserMessage

pytestmark = pytest.mark.device

STORY = ChatRequest(slot=0, messages=[UserMessage("Write a long story about a storm at sea.")])


@pytest.fixture
def relay(tools_server: llama.LlamaServer) -> Iterator[Relay]:
    with Relay(tools_server.host, tools_server.port) as relay:
        yield relay


def contents(events: list[ChatEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Content))


def uncut_answer(server: llama.LlamaServer, client: Client, req: ChatRequest) -> tuple[str, int]:
    """The server's own non-stream answer to the very body the client sends (temperature 0): its
    content and how many tokens it predicted."""
    body = json.loads(client.render(req))
    body["stream"] = False
    status, answer = server.post_json("/v1/chat/completions", body)
    assert status == 200, answer
    return str(answer["choices"][0]["message"]["content"]), int(answer["timings"]["predicted_n"])


def decoded_once_idle(server: llama.LlamaServer, slot: int, path: str = "/slots", limit_s: float = 240.0) -> int:
    """The tokens the slot's last task generated (`n_decoded`), read once `/slots` shows it idle
    (at most `limit_s`: a task run on to its `max_tokens` on a busy machine takes minutes)."""
    deadline = time.monotonic() + limit_s
    while True:
        code, slots = server.get_json(path)
        assert code == 200, slots
        (entry,) = [s for s in slots if s["id"] == slot]
        if not entry["is_processing"]:
            return int(entry["next_token"][0]["n_decoded"])
        assert time.monotonic() < deadline, f"slot {slot} still generating {limit_s:.0f} s on"
        time.sleep(0.01)


def test_a_stream_reset_at_a_random_byte_is_re_attached_and_the_answer_is_exact(
    tools_server: llama.LlamaServer, client_kind: Kind
) -> None:
    cut = random.randint(1500, 6000)
    with (
        Relay(tools_server.host, tools_server.port, reset_after=cut) as relay,
        ProxyProcess(f"127.0.0.1:{relay.port}") as proxy,
    ):
        client = make_client(proxy.socket_path, max_tokens=120, kind=client_kind)
        events: list[ChatEvent] = []
        completion = client.chat_with_retry(STORY, events.append)
        expected, tokens = uncut_answer(tools_server, client, STORY)

    assert relay.resets == 1, f"the relay reset the stream at byte {cut}"
    posts = [r for r in relay.requests if r.startswith("POST /v1/chat/completions")]
    reattaches = [r for r in relay.requests if r.startswith("GET /v1/stream?conv_id=")]
    assert len(posts) == 1, relay.requests
    assert reattaches and all("&from=" in r for r in reattaches), relay.requests
    assert completion.content == expected, f"cut at response byte {cut}"
    assert contents(events) == completion.content, "no event twice, none lost"
    assert sum(isinstance(e, Retrying) for e in events) == 1
    assert completion.timings.predicted_n == tokens, "the count runs on without a gap: nothing regenerated"


def test_a_stream_survives_its_proxy_being_killed_and_restarted_without_a_second_request(
    tools_server: llama.LlamaServer, relay: Relay, client_kind: Kind
) -> None:
    relay.hold_at_content = True  # the stream waits at its first content for the kill
    with ProxyProcess(f"127.0.0.1:{relay.port}") as proxy:
        client = make_client(proxy.socket_path, max_tokens=200, kind=client_kind)
        req = ChatRequest(slot=0, messages=QUESTION)
        events: list[ChatEvent] = []
        killed: list[float] = []

        def on_event(event: ChatEvent) -> None:
            events.append(event)
            if isinstance(event, Content) and not killed:
                killed.append(time.monotonic())
                proxy.kill()  # SIGKILL mid-stream: the socket file is left stale
                relay.released.set()  # the rest of the answer meets the dead proxy's connection
                proxy.start()  # the new proxy removes the stale socket and listens again

        completion = client.chat_with_retry(req, on_event)
        finished = time.monotonic()
        expected = nonstream_answer(tools_server, client, req)

    assert killed
    print(f"proxy kill to completion: {(finished - killed[0]) * 1000:.0f} ms")
    assert [r for r in relay.requests if r.startswith("POST ")] == ["POST /v1/chat/completions"]
    assert any(r.startswith("GET /v1/stream?conv_id=") for r in relay.requests)
    assert completion.content == expected["content"]
    assert contents(events) == completion.content, "the events go on where they broke"


def test_a_cancel_stops_the_generation_on_the_server_at_once(
    tools_server: llama.LlamaServer, relay: Relay, client_kind: Kind
) -> None:
    with ProxyProcess(f"127.0.0.1:{relay.port}") as proxy:
        client = make_client(proxy.socket_path, max_tokens=2000, kind=client_kind)
        token = CancelToken()
        cancelled_at: list[float] = []

        def on_event(event: ChatEvent) -> None:
            if isinstance(event, Content) and not cancelled_at:
                cancelled_at.append(time.monotonic())
                token.cancel()

        with pytest.raises(Cancelled):
            client.chat(STORY, on_event, cancel=token)
        decoded = decoded_once_idle(tools_server, 0)

    assert any(r.startswith("DELETE /v1/stream?conv_id=") for r in relay.requests), relay.requests
    # Uncancelled, this story runs on to its 2000 tokens; how soon the stop lands is the
    # machine's (the benchmarks time it), that it lands is the client's.
    assert decoded < 1000, f"stopped, not run on to max_tokens: {decoded} tokens generated"
