"""`inferproxy`: forwards each connection on a Unix socket to one TCP connection upstream.

The only code in the project that opens TCP. It never parses what it forwards, logs one line at
start, one per refused connection (a flood of refusals is summarised once a second) and one per
connection it gives up on (an unreachable upstream, a client silent past the first-byte limit),
and nothing about traffic. Stdlib only.
"""

from adapters.proxy.bucket import TokenBucket
from adapters.proxy.options import Address, ProxyLimits, Settings, UsageError, parse_args
from adapters.proxy.refusals import RefusalLines
from adapters.proxy.server import Proxy
from adapters.proxy.socket_file import (
    BoundSocket,
    PathLock,
    SocketFileError,
    bind_socket_file,
    lock_socket_path,
    remove_socket_file,
)
from adapters.proxy.stderr_log import StderrLog

__all__ = [
    "Address",
    "BoundSocket",
    "PathLock",
    "Proxy",
    "ProxyLimits",
    "RefusalLines",
    "Settings",
    "SocketFileError",
    "StderrLog",
    "TokenBucket",
    "UsageError",
    "bind_socket_file",
    "lock_socket_path",
    "parse_args",
    "remove_socket_file",
]
