"""One HTTP/1.1 request and its response over a byte stream, in both flavours.

`HttpExchange` (blocking) is generated from `AsyncHttpExchange` (asyncio): see
`adapters.uds_http._async.exchange`, the one source, for the contract and the invariants.
"""

from adapters.uds_http._async.exchange import AsyncHttpExchange
from adapters.uds_http._async.exchange import send as send_async
from adapters.uds_http._sync.exchange import RECV_BYTES, HttpExchange, send
from adapters.uds_http.response import Request, reason, render, render_for, write_failed, write_stalled

__all__ = [
    "RECV_BYTES",
    "AsyncHttpExchange",
    "HttpExchange",
    "Request",
    "reason",
    "render",
    "render_for",
    "send",
    "send_async",
    "write_failed",
    "write_stalled",
]
