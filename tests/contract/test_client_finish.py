"""Where a stream ends after its final chunk without `[DONE]`: the answer is whole and returned."""

from __future__ import annotations

from functools import partial

import pytest

from adapters.fake_server import End, FakeServer, sse_reply
from adapters.fake_server import chunk as stream_chunk
from app.client import Client
from app.config import parse_config
from app.container import Container
from client_support import Kind
from domain.completion import FinishReason
from domain.errors import Stalled
from domain.events import ChatEvent, Content
from domain.messages import ChatRequest, UserMessage

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

CID = "chatcmpl-finishtestfinishtestfinishtest00"
REQ = ChatRequest(slot=0, messages=[UserMessage("Hi")])


chunk = partial(stream_chunk, cid=CID, prompt_n=3)  # this stream has its own id and prompt


def client_for(kind: Kind, server: FakeServer) -> Client:
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
    with pytest.raises(Stalled):
        client_for(client_kind, server).chat(REQ, events.append)
    assert events == [Content("Hel")]
