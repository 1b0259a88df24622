"""Against a llama-server router (`cache_server.CachingLlama(router=True)`): no call but a chat
loads the model, a chat waits for a load with typed `Waiting` events, and a checkpoint brings a
session back after another model took its place; a stream an unload cut is named for it. Over
both clients.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapters.fake_server import FakeServer, ReplayRing, json_reply
from app.client import Client
from app.config import parse_config
from app.container import Container
from cache_server import CachingLlama
from client_support import CHAT, NO_PROXY_LIMIT, REQ, STOP, Kind, chunk, config_for, recorded
from domain.errors import HttpError, ModelNotLoaded, StreamClosedEarly
from domain.events import CachePrediction, ChatEvent, ModelWait, Retrying, Waiting
from domain.messages import AssistantMessage, ChatRequest, SystemMessage, UserMessage

SYSTEM = SystemMessage("You are terse. " * 20)
ASK = UserMessage("Capital of France?")
NEXT = UserMessage("And of Spain?")
LOAD_S = 0.3
POLL_MS = 50


def client_for(kind: Kind, server: FakeServer, **limits: Any) -> Client:
    data: dict[str, Any] = {
        "proxy": NO_PROXY_LIMIT,
        "socket": server.socket_path,
        "limits": {"poll_ms": POLL_MS, "load_wait_ms": 5000, "busy_wait_ms": 5000, "idle_grace_ms": 5000, **limits},
        "retry": {"attempts": 1, "delays_ms": []},
    }
    return kind.client_of(Container(config=parse_config(data)))


def chat(client: Client, *messages: Any) -> tuple[Any, list[ChatEvent]]:
    events: list[ChatEvent] = []
    completion = client.chat(ChatRequest(slot=0, messages=messages), events.append)
    return completion, events


def targets(server: FakeServer) -> list[str]:
    return [f"{r.method} {r.target}" for r in server.requests]


def test_the_info_calls_of_a_model_not_loaded_say_so_and_load_nothing(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server, router=True)
    llama.swap()
    client = client_for(client_kind, server)

    for call in (client.props, client.slots, lambda: client.tokenize("hi"), lambda: client.save_slot(0)):
        with pytest.raises(ModelNotLoaded) as caught:
            call()
        assert isinstance(caught.value, HttpError) and caught.value.status == 400
    assert llama.loads == 0, "no call but a chat loads the model"
    assert all("autoload=false" in target for target in targets(server)), targets(server)

    props = client.props(load=True)  # the self-test's and --print-expect's: it loads

    assert props.total_slots == 2 and llama.loads == 1


def test_a_chat_has_the_model_loaded_first_and_says_so_while_it_loads(server: FakeServer, client_kind: Kind) -> None:
    # No [expect]: the slot count is asked of the router, which has not loaded the model.
    llama = CachingLlama(server, router=True, load_s=LOAD_S)
    llama.swap()

    completion, events = chat(client_for(client_kind, server), SYSTEM, ASK)

    assert completion.content == "Paris."
    waits = [e for e in events if isinstance(e, Waiting)]
    seen_loading = sum(1 for w in waits if w.model is ModelWait.LOADING)
    assert seen_loading, "a load of 300 ms is seen by polls every 50 ms"
    assert waits[:seen_loading] == [Waiting(slot_busy=False, model=ModelWait.LOADING)] * seen_loading, waits
    # A slow machine may poll once more between the load's end and the head: the slot idle then.
    assert waits[seen_loading:] == [Waiting(slot_busy=False)] * (len(waits) - seen_loading), waits
    assert llama.loads == 1
    loading = [t for t in targets(server) if "autoload=false" not in t and t.startswith("GET /props")]
    assert loading == ["GET /props?model=default"], "one request loads it, the rest never do"


def test_a_load_counts_against_load_wait_ms_and_ends_in_load_timeout(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server, router=True, load_s=5.0)
    llama.swap()

    with pytest.raises(Exception) as caught:
        chat(client_for(client_kind, server, load_wait_ms=200), SYSTEM, ASK)

    assert type(caught.value).__name__ == "LoadTimeout"
    assert "the model was loading for" in str(caught.value)


def test_a_checkpoint_brings_a_session_back_after_another_model_took_its_place(
    server: FakeServer, client_kind: Kind
) -> None:
    llama = CachingLlama(server, router=True, load_s=LOAD_S)
    client = client_for(client_kind, server)
    first, _ = chat(client, SYSTEM, ASK)
    checkpoint = client.save_slot(0)
    assert checkpoint is not None and checkpoint.tokens > 0
    llama.swap()  # another daemon's model in its place: ours unloaded, its slots emptied

    second, events = chat(client, SYSTEM, ASK, AssistantMessage(first.content), NEXT)

    [prediction] = [e for e in events if isinstance(e, CachePrediction)]
    assert prediction.restored == checkpoint.tokens
    assert any(isinstance(e, Waiting) and e.model is ModelWait.LOADING for e in events)
    assert events.index(prediction) > max(i for i, e in enumerate(events) if isinstance(e, Waiting))
    assert second.timings.cache_n >= checkpoint.tokens - 1, "the turn reused the restored slot"
    restores = [t for t in targets(server) if "action=restore" in t]
    assert len(restores) == 1 and llama.loads == 1
    saved = [r for r in server.requests if "action=save" in r.target]
    assert saved[0].json()["model"] == "default", "a router routes the POST by its body's model"


WORDS = 60
LONG = [
    chunk({"role": "assistant", "content": None}, n=0),
    *(chunk({"content": f" w{n}"}, n=n) for n in range(1, WORDS + 1)),
    chunk(finish="stop", n=WORDS),
]


def unloaded_mid_answer(server: FakeServer, status: str) -> ReplayRing:
    """A router whose model was unloaded while it streamed: the stream cut, its replay gone
    (404), and `/models` saying `status` of the model (the single-model server's `/models` has no
    status at all)."""
    ring = ReplayRing(LONG, cut_after=1024)
    server.route(*CHAT, ring.chat)
    server.route(*STOP, ring.stop)
    server.route("GET", "/v1/stream", lambda request: (ring.forget(), ring.reattach(request))[1])
    model = config_for(server.socket_path).model
    said = status.split(",")  # the status of each ask in turn, the last one repeated

    def models(request: object) -> Any:
        value = said.pop(0) if len(said) > 1 else said[0]
        entry: dict[str, Any] = {"id": model, "object": "model"}
        if value:
            entry["status"] = {"value": value}
        return json_reply({"object": "list", "data": [entry]})

    server.route("GET", "/models", models)
    return ring


@pytest.mark.parametrize("status", ["unloaded", "loading", "sleeping"])
def test_a_stream_an_unload_cut_is_named_for_the_unload(server: FakeServer, client_kind: Kind, status: str) -> None:
    unloaded_mid_answer(server, status)

    with pytest.raises(StreamClosedEarly) as caught:
        client_kind.client_for(server).chat(REQ, lambda event: None)

    assert "the router unloaded the model mid-answer" in str(caught.value), caught.value
    assert len(recorded(server, CHAT)) == 1, "chat() sends it once"


def test_a_re_send_after_an_unload_says_so_and_the_answer_is_whole(server: FakeServer, client_kind: Kind) -> None:
    ring = unloaded_mid_answer(server, "unloaded")
    events: list[ChatEvent] = []

    completion = client_kind.client_for(server).chat_with_retry(REQ, events.append)

    resend = [e for e in events if isinstance(e, Retrying) and e.resend]
    assert len(resend) == 1 and "the router unloaded the model mid-answer" in resend[0].error, resend
    assert completion.content == "".join(f" w{n}" for n in range(1, WORDS + 1))
    assert ring.stopped[:1] == ring.conversations[:1]


@pytest.mark.parametrize("status", ["loaded", ""], ids=["router, loaded", "single-model"])
def test_a_refused_re_attach_with_the_model_still_loaded_names_no_unload(
    server: FakeServer, client_kind: Kind, status: str
) -> None:
    unloaded_mid_answer(server, status)

    with pytest.raises(StreamClosedEarly) as caught:
        client_kind.client_for(server).chat(REQ, lambda event: None)

    assert "unloaded" not in str(caught.value), caught.value


def test_a_stream_that_ends_without_its_final_chunk_on_an_unload_is_named_for_it(
    server: FakeServer, client_kind: Kind
) -> None:
    unloaded_mid_answer(server, "unloaded")
    server.route(*CHAT, ReplayRing(LONG[:5], done=False).chat)  # the child exited: a clean end, early

    with pytest.raises(StreamClosedEarly) as caught:
        client_kind.client_for(server).chat(REQ, lambda event: None)

    assert "before its final chunk" in str(caught.value)
    assert "the router unloaded the model mid-answer" in str(caught.value), caught.value


def test_a_router_that_says_loaded_a_moment_after_the_cut_is_asked_again(server: FakeServer, client_kind: Kind) -> None:
    # A router says "loaded" until the stopped model's server has exited, a moment after the cut.
    unloaded_mid_answer(server, "loaded,loaded,unloaded")

    with pytest.raises(StreamClosedEarly) as caught:
        client_kind.client_for(server).chat(REQ)

    assert "the router unloaded the model mid-answer" in str(caught.value), caught.value
    assert len([r for r in server.requests if r.path == "/models"]) == 3
