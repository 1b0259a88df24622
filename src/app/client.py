"""The llama client, blocking: `Client`, generated from the asyncio source (`app._async.client`
and `app._async.call`) by `scripts/unasync.py`, so the two flavours are one call written once.

    client = Container(config=cfg).client()
    completion = client.chat_with_retry(req, on_event=print)
    with client.stream(req) as s:
        for event in s: ...
    s.completion
"""

from app._sync.client import Client, EventSink
from app.event_stream import EventStream
from domain.llama_api import Props, SlotInfo, Token
from domain.prompt_cache import Checkpoint

__all__ = ["Checkpoint", "Client", "EventSink", "EventStream", "Props", "SlotInfo", "Token"]
