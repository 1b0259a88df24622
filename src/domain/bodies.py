"""What a body read whole must be, sans-IO: the rules of the small requests, as values.

For answers that are not streams (`/props`, `/slots`, `/tokenize`, `reasoning_end`) and for the
body of an error answer. The call code (`app._async.fetch`, written once for both flavours) only
moves the bytes over the `Exchange` port and hands each result to these objects:

- `FetchLimits`: the head within `head_wait_s` of sending; then the body (or an error body)
  within `body_wait_s` more, in all, however it trickles in.
- `answered(head, ...)`: no head within its wait is `Stalled`.
- `WholeBody`: the head (if it has not come yet) and the whole body within `timeout` seconds in
  all, or `Stalled` saying how far it came; at most `limit` body bytes, or `ProtocolError`
  naming the limit. A `Content-Length` over the limit is refused before any body byte is read:
  the promise is enough.
- `ErrorBody`: an error answer's status is the news, so its body is kept as far as it came by
  its deadline, up to its cap: a slow, long or cut error body is never an error of its own.
"""

from __future__ import annotations

from domain.errors import ProtocolError, Stalled
from domain.limits import FetchLimits
from ports.transport import ResponseHead, TimedOut

__all__ = ["ErrorBody", "FetchLimits", "WholeBody", "answered", "promised_length"]

_NO_BODY = (204, 304)


def answered(
    head: ResponseHead | TimedOut, method: str, path: str, limits: FetchLimits
) -> ResponseHead:
    """The head of a small request, or `Stalled` if it did not come within its wait."""
    if isinstance(head, TimedOut):
        raise Stalled(f"{method} {path}: no answer within {limits.head_wait_s * 1000:.0f} ms")
    return head


class WholeBody:
    """One body wanted whole: `start(head)`, then `take(piece)` until it returns True, then
    `data()`. Each raises what the rule says when it is broken."""

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
            raise ProtocolError(
                f"{self._what}: Content-Length {length} is over the {self._limit}-byte body limit"
            )

    def take(self, piece: bytes | TimedOut) -> bool:
        """A read's result; True once the body ended (`b""`)."""
        if isinstance(piece, TimedOut):
            raise Stalled(
                f"{self._what}: body incomplete after {self._timeout * 1000:.0f} ms"
                f" ({self._total} bytes read)"
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


class ErrorBody:
    """Up to `limit` bytes of an error answer's body, as far as it came by `deadline` (a time on
    the caller's clock): `wait(now)` is how long to read for next (None: stop reading), `take`
    each read's result (True: stop reading), then `data()`."""

    __slots__ = ("_deadline", "_kept", "_limit")

    def __init__(self, limit: int, deadline: float) -> None:
        self._limit = limit
        self._deadline = deadline
        self._kept = bytearray()

    def wait(self, now: float) -> float | None:
        if len(self._kept) >= self._limit:
            return None
        left = self._deadline - now
        return left if left > 0.0 else None

    def take(self, piece: bytes | TimedOut) -> bool:
        if isinstance(piece, TimedOut) or not piece:
            return True
        self._kept += piece[: self._limit - len(self._kept)]
        return len(self._kept) >= self._limit

    def data(self) -> bytes:
        return bytes(self._kept)


def promised_length(head: ResponseHead) -> int | None:
    """The body length the head promises: its `Content-Length`, for a status that has a body
    and a body that is not chunked. The exchange has already refused a malformed or ambiguous
    one, so a value here is plain digits."""
    status = head.status
    if status < 200 or status in _NO_BODY or head.header("transfer-encoding") is not None:
        return None
    length = head.header("content-length")
    return int(length) if length is not None and length.isdigit() else None
