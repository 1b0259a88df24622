"""`inferproxy`: forwards each connection on a Unix socket to one TCP connection upstream.

The only code in the project that opens TCP. It never parses what it forwards, logs one line at
start and one per refused connection, and nothing about traffic. Stdlib only.
"""

from adapters.proxy.bucket import TokenBucket
from adapters.proxy.options import Address, Limits, Settings, UsageError, parse_args
from adapters.proxy.server import Proxy
from adapters.proxy.socket_file import BoundSocket, SocketFileError, bind_socket_file, remove_socket_file

__all__ = [
    "Address",
    "BoundSocket",
    "Limits",
    "Proxy",
    "Settings",
    "SocketFileError",
    "TokenBucket",
    "UsageError",
    "bind_socket_file",
    "parse_args",
    "remove_socket_file",
]
