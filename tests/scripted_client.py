"""What the client's in-memory tests share: a sync `Client` on the scripted transport, a fake clock
that moves only when a read waits or the client sleeps, and a slot that is idle; the request and
the short answer those tests stream.

    from scripted_client import ANSWER, CID, REQ, chunk, scripted_client   # with tests/ on sys.path

    def test_x(scripted_client: Callable[..., tuple[Client, ScriptedTransport]]) -> None:
        client, transport = scripted_client({CHAT: sse_reply(ANSWER)}, limits={...})

The fixture is `tests/unit/conftest.py`'s, built here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from adapters.fake_server import FakeClock, FakeSlotProbe, ScriptedTransport
from adapters.fake_server.script import RouteSpec
from app.client import Client
from app.config import parse_config
from client_support import EXPECT, overridden
from client_support import chunk as stream_chunk
from domain.messages import ChatRequest, UserMessage
from ports import SlotState

CID = "chatcmpl-client"
REQ = ChatRequest(slot=1, messages=(UserMessage("hello"),))
chunk = partial(stream_chunk, cid=CID, cache_n=3, prompt_n=39)
ANSWER = [chunk({"content": "Hi"}, n=1), chunk({"content": "!"}, n=2), chunk(finish="stop", n=2)]


class ZeroJitter:
    def uniform(self, a: float, b: float) -> float:
        return 0.0


def scripted_clients() -> Iterator[Callable[..., tuple[Client, ScriptedTransport]]]:
    """`build(routes, **config_sections)`: a client and its transport, per call."""

    def build(routes: dict[tuple[str, str], RouteSpec], **sections: Any) -> tuple[Client, ScriptedTransport]:
        config = parse_config({"socket": "/fake/llama.sock", "expect": EXPECT, **sections})
        clock = FakeClock()
        transport = ScriptedTransport(clock, routes)
        probe = FakeSlotProbe({REQ.slot: SlotState.IDLE})
        container = make(config, clock=clock, transport=transport, probe=probe, rng=ZeroJitter())
        return container.client(), transport

    with overridden() as make:
        yield build
