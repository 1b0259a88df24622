"""`inferproxy`: forwards each connection on a Unix socket to one TCP connection upstream.

The only code in the project that opens TCP. It never parses what it forwards, logs one line at
start, one per refused connection (a flood of refusals is summarised once a second) and one per
connection it gives up on (an unreachable upstream, a client silent past the first-byte limit),
and nothing about traffic. Stdlib only.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Loaded when first asked for, not with the package: `python -m adapters.proxy` starts its
# `__main__` (which holds the stop signals from its first step) before any of them.
_HOMES = {
    "TokenBucket": "adapters.proxy.bucket",
    "Address": "adapters.proxy.options",
    "ProxyLimits": "adapters.proxy.options",
    "Settings": "adapters.proxy.options",
    "UsageError": "adapters.proxy.options",
    "parse_args": "adapters.proxy.options",
    "RefusalLines": "adapters.proxy.refusals",
    "Proxy": "adapters.proxy.server",
    "BoundSocket": "adapters.proxy.socket_file",
    "PathLock": "adapters.proxy.socket_file",
    "SocketFileError": "adapters.proxy.socket_file",
    "bind_socket_file": "adapters.proxy.socket_file",
    "lock_socket_path": "adapters.proxy.socket_file",
    "remove_socket_file": "adapters.proxy.socket_file",
    "StderrLog": "adapters.proxy.stderr_log",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


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
