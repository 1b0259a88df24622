"""Where a stream ends after its final chunk without `[DONE]`: the answer is whole and returned."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from adapters.fake_server import End, FakeServer, sse_reply
from adapters.fake_server import chunk as stream_chunk
from app.client import Client
from app.config import parse_config
from app.container import Container
from client_support import Kind
from domain.completion import FinishReason
from domain.errors import Stalled
from domain.events import ChatEvent, Content, Retrying
from domain.messages import ChatRequest, UserMessage

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

CID = "chatcmpl-finishtestfinishtestfinishtest00"
REQ = ChatRequest(slot=0, messages=[UserMessage("Hi")])


chunk = partial(stream_chunk, cid=CID, prompt_n=3)  # this stream has its own id and prompt


def client_for(kind: Kind, server: FakeServer, **sections: Any) -> Client:
    config = parse_config(
        {
            "socket": server.socket_path,
            "limits": {
                "poll_ms": 100,
                "liveness_ms": 100,
                "idle_grace_ms": 150,
                "busy_wait_ms": 150,
                "load_wait_ms": 150,
            },
            "expect": {"chat_template_sha256": "0" * 64, "n_ctx": 4096, "total_slots": 1},
            **sections,
        }
    )
    return kind.client_of(Container(config=config))


def test_final_chunk_then_silence_returns_the_whole_answer_after_the_liveness_limit(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        sse_reply([chunk({"content": "Hello"}, n=1), chunk({}, finish="stop", n=1)], done=False, end=End.SILENCE),
    )
    events: list[ChatEvent] = []
    completion = client_for(client_kind, server).chat(REQ, events.append)
    assert events == [Content("Hello")]
    assert (completion.content, completion.finish_reason) == ("Hello", FinishReason.STOP)


def test_silence_before_the_final_chunk_is_still_stalled(server: FakeServer, client_kind: Kind) -> None:
    server.route(
        "POST", "/v1/chat/completions", sse_reply([chunk({"content": "Hel"}, n=1)], done=False, end=End.SILENCE)
    )
    events: list[ChatEvent] = []
    retry = {"attempts": 2, "delays_ms": [20], "jitter": 0.0}
    with pytest.raises(Stalled):
        client_for(client_kind, server, retry=retry).chat(REQ, events.append)
    # A stall mid-answer is a break to pick up: one re-attach (refused here: no replay), then Stalled.
    content, retrying = events
    assert content == Content("Hel")
    assert isinstance(retrying, Retrying) and (retrying.attempt, retrying.after_ms) == (2, 20)
    assert retrying.error.startswith("Stalled: ")
    assert [r.method for r in server.requests if r.path == "/v1/stream"] == ["GET", "DELETE"]
