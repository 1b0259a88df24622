"""HTTP/1.1 over a Unix socket: the real `Transport` and `AsyncTransport`, one connection per
exchange. Written once for asyncio under `_async/`; the blocking twins under `_sync/` are generated
from it (`scripts/unasync.py`). The sockets under them are `adapters.uds_http.sockets`."""

from adapters.uds_http._async.exchange import AsyncHttpExchange
from adapters.uds_http._async.transport import AsyncUdsTransport
from adapters.uds_http._sync.exchange import HttpExchange
from adapters.uds_http._sync.transport import UdsTransport
from adapters.uds_http.sockets import AsyncSocketStream, SocketStream

__all__ = [
    "AsyncHttpExchange",
    "AsyncSocketStream",
    "AsyncUdsTransport",
    "HttpExchange",
    "SocketStream",
    "UdsTransport",
]
