"""A body read whole, under one deadline and one size limit, over the `Exchange` port.

For answers that are not streams (`/props`, `/slots`, `/tokenize`) and for error bodies. The
exchange de-frames; this only adds the deadline and the limit, so every exchange gets the same
rule:

- the head (if it has not come yet) and the whole body within `timeout` seconds in all, or
  `Stalled` saying how far it came;
- at most `limit` body bytes, or `ProtocolError` naming the limit. A `Content-Length` over the
  limit is refused before any body byte is read: the promise is enough.

The rule is `WholeBody` (what arrived in, the verdict out); `read_all` and `read_all_async`
only move the bytes, over the `Exchange` and `AsyncExchange` ports.
"""

from __future__ import annotations

from domain.errors import ProtocolError, Stalled
from ports.clock import Clock
from ports.transport import AsyncExchange, Exchange, ResponseHead, TimedOut

_NO_BODY = (204, 304)


def read_all(exchange: Exchange, clock: Clock, limit: int, timeout: float) -> bytes:
    """The body of `exchange`, whole (see the module for the rule). Errors of `head` and `read`
    (a cut, malformed framing) pass through."""
    deadline = clock.now() + timeout
    body = WholeBody(exchange.what, limit, timeout)
    body.start(exchange.head(timeout))
    while not body.take(exchange.read(max(deadline - clock.now(), 0.0))):
        pass
    return body.data()


async def read_all_async(exchange: AsyncExchange, clock: Clock, limit: int, timeout: float) -> bytes:
    """`read_all` over an `AsyncExchange`."""
    deadline = clock.now() + timeout
    body = WholeBody(exchange.what, limit, timeout)
    body.start(await exchange.head(timeout))
    while not body.take(await exchange.read(max(deadline - clock.now(), 0.0))):
        pass
    return body.data()


class WholeBody:
    """One body wanted whole, sans-IO: `start(head)`, then `take(piece)` until it returns True,
    then `data()`. Each raises what the rule says when it is broken."""

    __slots__ = ("_limit", "_parts", "_timeout", "_total", "_what")

    def __init__(self, what: str, limit: int, timeout: float) -> None:
        self._what = what
        self._limit = limit
        self._timeout = timeout
        self._parts: list[bytes] = []
        self._total = 0

    def start(self, head: ResponseHead | TimedOut) -> None:
        """The head, or `TIMED_OUT` if it did not come in time (`Stalled`)."""
        if isinstance(head, TimedOut):
            raise Stalled(f"{self._what}: no response head within {self._timeout} s")
        length = promised_length(head)
        if length is not None and length > self._limit:
            raise ProtocolError(f"{self._what}: Content-Length {length} is over the {self._limit}-byte body limit")

    def take(self, piece: bytes | TimedOut) -> bool:
        """A read's result; True once the body ended (`b""`)."""
        if isinstance(piece, TimedOut):
            raise Stalled(
                f"{self._what}: body incomplete after {self._timeout * 1000:.0f} ms ({self._total} bytes read)"
            )
        if not piece:
            return True
        self._total += len(piece)
        if self._total > self._limit:
            raise ProtocolError(f"{self._what}: body over the {self._limit}-byte limit")
        self._parts.append(piece)
        return False

    def data(self) -> bytes:
        return b"".join(self._parts)


def promised_length(head: ResponseHead) -> int | None:
    """The body length the head promises: its `Content-Length`, for a status that has a body
    and a body that is not chunked. The exchange has already refused a malformed or ambiguous
    one, so a value here is plain digits."""
    status = head.status
    if status < 200 or status in _NO_BODY or head.header("transfer-encoding") is not None:
        return None
    length = head.header("content-length")
    return int(length) if length is not None and length.isdigit() else None
