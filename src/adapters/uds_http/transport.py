"""HTTP/1.1 over a Unix socket, one request per connection: the real `Transport` and
`AsyncTransport`.

`UdsTransport` (blocking) is generated from `AsyncUdsTransport` (asyncio): see
`adapters.uds_http._async.transport`, the one source. The sockets under them are
`adapters.uds_http.sockets`.
"""

from adapters.uds_http._async.transport import AsyncUdsTransport
from adapters.uds_http._sync.exchange import HttpExchange
from adapters.uds_http._sync.transport import UdsTransport, exchange_over
from adapters.uds_http.sockets import AsyncSocketStream, SocketStream, connect_reason

UdsExchange = HttpExchange
"""The exchange `UdsTransport.open` returns (the one exchange class, over a socket)."""

__all__ = [
    "AsyncSocketStream",
    "AsyncUdsTransport",
    "SocketStream",
    "UdsExchange",
    "UdsTransport",
    "connect_reason",
    "exchange_over",
]
