"""A body read whole, under one deadline and one size limit, over the `Exchange` port.

For answers that are not streams (`/props`, `/slots`, `/tokenize`) and for error bodies. The
exchange de-frames; this only adds the deadline and the limit, so every exchange gets the same
rule:

- the head (if it has not come yet) and the whole body within `timeout` seconds in all, or
  `Stalled` saying how far it came;
- at most `limit` body bytes, or `ProtocolError` naming the limit. A `Content-Length` over the
  limit is refused before any body byte is read: the promise is enough.
"""

from __future__ import annotations

from domain.errors import ProtocolError, Stalled
from ports.clock import Clock
from ports.transport import Exchange, ResponseHead, TimedOut

_NO_BODY = (204, 304)


def read_all(exchange: Exchange, clock: Clock, limit: int, timeout: float) -> bytes:
    """The body of `exchange`, whole (see the module for the rule). Errors of `head` and `read`
    (a cut, malformed framing) pass through."""
    deadline = clock.now() + timeout
    head = exchange.head(timeout)
    if isinstance(head, TimedOut):
        raise Stalled(f"{exchange.what}: no response head within {timeout} s")
    length = promised_length(head)
    if length is not None and length > limit:
        raise ProtocolError(f"{exchange.what}: Content-Length {length} is over the {limit}-byte body limit")
    parts: list[bytes] = []
    total = 0
    while True:
        piece = exchange.read(max(deadline - clock.now(), 0.0))
        if isinstance(piece, TimedOut):
            raise Stalled(f"{exchange.what}: body incomplete after {timeout} s ({total} bytes read)")
        if not piece:
            return b"".join(parts)
        total += len(piece)
        if total > limit:
            raise ProtocolError(f"{exchange.what}: body over the {limit}-byte limit")
        parts.append(piece)


def promised_length(head: ResponseHead) -> int | None:
    """The body length the head promises: its `Content-Length`, for a status that has a body
    and a body that is not chunked. The exchange has already refused a malformed or ambiguous
    one, so a value here is plain digits."""
    status = head.status
    if status < 200 or status in _NO_BODY or head.header("transfer-encoding") is not None:
        return None
    length = head.header("content-length")
    return int(length) if length is not None and length.isdigit() else None
