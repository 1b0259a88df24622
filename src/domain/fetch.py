"""A small request whose answer is one body, not a stream, under one deadline rule.

Used for `/props`, `/slots` (by the client and the slot probe), `/tokenize` and the
`reasoning_end` control call. The rule: the response head within `head_wait_s` of sending; then
the body (or an error body) within `body_wait_s` more, in all, however it trickles in.

- A 200 answer's body is returned whole, or `ProtocolError` past `body_bytes`.
- Any other status is `HttpError(status, body)` with as much of the body as came within the
  deadline, up to `error_body_bytes`: the status is the news, so a slow, long or cut error body
  is kept as far as it came, never an error of its own.
- The connection is always closed before returning or raising.

`fetch_async` is the same rule over the asyncio ports; cancelling the task closes the
connection too.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.errors import HttpError, InferError, Stalled
from domain.whole_body import read_all, read_all_async
from ports.clock import Clock
from ports.transport import AsyncExchange, AsyncTransport, CancelSignal, Exchange, ResponseHead, TimedOut, Transport


@dataclass(frozen=True, slots=True)
class FetchLimits:
    head_wait_s: float
    body_wait_s: float
    body_bytes: int
    error_body_bytes: int


def fetch(
    transport: Transport,
    clock: Clock,
    method: str,
    path: str,
    body: bytes | None,
    limits: FetchLimits,
    cancel: CancelSignal | None = None,
) -> bytes:
    """The body of a 200 answer to `method path`; see the module for the rule. `cancel` aborts
    the connection when the call is cancelled."""
    exchange = transport.open(method, path, body, timeout=limits.head_wait_s, cancel=cancel)
    try:
        head = _answered(exchange.head(limits.head_wait_s), method, path, limits)
        deadline = clock.now() + limits.body_wait_s
        if head.status != 200:
            raise HttpError(
                head.status, error_body(exchange, clock, deadline, limits.error_body_bytes), limits.error_body_bytes
            )
        return read_all(exchange, clock, limits.body_bytes, max(deadline - clock.now(), 0.0))
    finally:
        exchange.close()


async def fetch_async(
    transport: AsyncTransport, clock: Clock, method: str, path: str, body: bytes | None, limits: FetchLimits
) -> bytes:
    """`fetch` over the asyncio ports."""
    exchange = await transport.open(method, path, body, timeout=limits.head_wait_s)
    try:
        head = _answered(await exchange.head(limits.head_wait_s), method, path, limits)
        deadline = clock.now() + limits.body_wait_s
        if head.status != 200:
            kept = await error_body_async(exchange, clock, deadline, limits.error_body_bytes)
            raise HttpError(head.status, kept, limits.error_body_bytes)
        return await read_all_async(exchange, clock, limits.body_bytes, max(deadline - clock.now(), 0.0))
    finally:
        exchange.close()


def _answered(head: ResponseHead | TimedOut, method: str, path: str, limits: FetchLimits) -> ResponseHead:
    if isinstance(head, TimedOut):
        raise Stalled(f"{method} {path}: no answer within {limits.head_wait_s * 1000:.0f} ms")
    return head


def error_body(exchange: Exchange, clock: Clock, deadline: float, limit: int) -> bytes:
    """Up to `limit` bytes of an error answer's body, as far as it came by `deadline`."""
    kept = bytearray()
    try:
        while len(kept) < limit:
            left = deadline - clock.now()
            if left <= 0.0:
                break
            piece = exchange.read(left)
            if isinstance(piece, TimedOut) or not piece:
                break
            kept += piece
    except InferError:
        pass  # a body cut short still says what it can
    return bytes(kept[:limit])


async def error_body_async(exchange: AsyncExchange, clock: Clock, deadline: float, limit: int) -> bytes:
    """`error_body` over an `AsyncExchange`."""
    kept = bytearray()
    try:
        while len(kept) < limit:
            left = deadline - clock.now()
            if left <= 0.0:
                break
            piece = await exchange.read(left)
            if isinstance(piece, TimedOut) or not piece:
                break
            kept += piece
    except InferError:
        pass  # a body cut short still says what it can
    return bytes(kept[:limit])
