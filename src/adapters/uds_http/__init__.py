"""HTTP/1.1 over a Unix socket: the real `Transport` and `AsyncTransport`."""

from adapters.uds_http.exchange import AsyncHttpExchange, HttpExchange
from adapters.uds_http.sockets import AsyncSocketStream, SocketStream
from adapters.uds_http.transport import AsyncUdsTransport, UdsExchange, UdsTransport

__all__ = [
    "AsyncHttpExchange",
    "AsyncSocketStream",
    "AsyncUdsTransport",
    "HttpExchange",
    "SocketStream",
    "UdsExchange",
    "UdsTransport",
]
