"""The small requests' I/O in both flavours (see `app._async.fetch`, the one source): the body of
a 200 answer under `domain.bodies`' rules, a body read whole, an error body, a generation's stop."""

from app._async.fetch import error_body as error_body_async
from app._async.fetch import fetch as fetch_async
from app._async.fetch import read_all as read_all_async
from app._async.fetch import stop as stop_async
from app._sync.fetch import error_body, fetch, read_all, stop

__all__ = [
    "error_body",
    "error_body_async",
    "fetch",
    "fetch_async",
    "read_all",
    "read_all_async",
    "stop",
    "stop_async",
]
