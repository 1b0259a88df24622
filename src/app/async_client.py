"""The llama client for asyncio: `AsyncClient`, `app.client.Client`'s surface awaited, on the same
domain and from the same source (`app._async.client` and `app._async.call`).

    client = Container(config=cfg).async_client()
    completion = await client.chat_with_retry(req, on_event=print)
    async with client.stream(req) as s:
        async for event in s: ...
    s.completion

Cancellation is asyncio's own too: cancelling the task that awaits `chat` (or iterates a stream)
ends the call in whatever phase it is; the connections are closed (the server sees the close),
the slot given back, and `asyncio.CancelledError` propagates. A `CancelToken` (`cancel=`) and
`aclose()` raise `Cancelled` or `ClientClosed`, as with the sync client.
"""

from app._async.client import AsyncClient, EventSink
from app.event_stream import AsyncEventStream
from domain.prompt_cache import Checkpoint

__all__ = ["AsyncClient", "AsyncEventStream", "Checkpoint", "EventSink"]
