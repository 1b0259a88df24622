"""The asyncio client never blocks its event loop: several streams, polls and info calls at once
on a loop in debug mode, which logs every callback or task step that holds the loop longer than
`slow_callback_duration` ("Executing <Task ...> took 0.031 seconds")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adapters.fake_server import FakeServer, json_reply, sse_reply
from app.container import Container
from client_support import CHAT, PROPS, SLOTS, chunk, config_for
from domain.messages import ChatRequest, UserMessage

pytestmark = pytest.mark.timeout(20)


def test_several_streams_never_block_a_debug_mode_loop(server: FakeServer, caplog: pytest.LogCaptureFixture) -> None:
    # asyncio's debug mode logs "Executing <Handle ...> took 0.031 seconds" for every callback or
    # task step that holds the loop longer than `slow_callback_duration`.
    pieces = [chunk({"content": f" w{n}"}, n=n) for n in range(1, 41)]
    server.route(*CHAT, sse_reply([*pieces, chunk(finish="stop", n=40)], delay_s=0.005))
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]))
    aio = Container(config=config_for(server.socket_path, liveness_ms=2000)).async_client()
    reqs = [ChatRequest(slot=n % 2, messages=(UserMessage(f"story {n}"),)) for n in range(6)]

    async def run() -> list[Any]:
        loop = asyncio.get_running_loop()
        await aio.chat(reqs[0], lambda event: None)  # imports and first-use costs outside the watch
        loop.set_debug(True)
        loop.slow_callback_duration = 0.02
        streams = [aio.chat(req, lambda event: None) for req in reqs]
        return [*await asyncio.gather(*streams), await aio.slots(), await aio.props()]

    server.route(
        *PROPS, json_reply({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2, "chat_template": "t"})
    )
    with caplog.at_level("WARNING", logger="asyncio"):
        results = asyncio.run(run())

    assert [c.content for c in results[:6]] == ["".join(f" w{n}" for n in range(1, 41))] * 6
    slow = [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.getMessage()]
    assert slow == []
