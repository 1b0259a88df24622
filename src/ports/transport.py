"""One HTTP exchange on one Unix-socket connection.

The contract every transport meets (one contract suite runs on the Unix-socket adapter and the
in-memory fake; both return the same exchange, over a socket or a script, see `ports.stream`):

- `Transport.open(method, path, body, timeout, headers=())` connects, sends the whole request
  (`headers` besides its own: `Host`, the body's type and length, `Connection: close`) and
  returns an `Exchange`. It raises `ConnectError` (naming the socket path) if the socket cannot be
  reached, `StreamClosedEarly` if the connection breaks while the request is written, `Stalled` if
  writing it takes over `timeout`. `cancel=signal` ties the exchange to the call's cancellation
  before the first byte is written: cancelling aborts it, and closing it unregisters.
- `Transport.connect(timeout, cancel=None)` connects and sends nothing: a `Link`, which
  `open(..., link=link)` sends its request on instead of connecting (the exchange owns it then;
  `open` closes it on every failure, a malformed request's included). It raises as `open` would;
  an unused `Link` is closed by its owner (`close()`: idempotent, never raises). Both connect or
  fail at once, but a full accept backlog is waited out within `timeout`; `cancel` (or cancelling
  the task) ends that wait with `ConnectError`.
- `Exchange.what` names the request (`"GET /props"`); each error it raises begins with it.
- `Exchange.head(timeout)` waits up to `timeout` seconds for the status line and headers: a
  `ResponseHead` (the same at once on later calls), or `TIMED_OUT` if nothing complete came in
  time (the exchange stays usable: poll elsewhere, call again). A head over its size cap, malformed,
  or with both `Transfer-Encoding` and `Content-Length` raises `ProtocolError` (and keeps raising
  it); EOF before its end raises `StreamClosedEarly`.
- `Exchange.read(timeout)` returns the next piece of the de-framed body (chunked, content-length or
  read-to-close), `b""` if and only if the body ended cleanly, or `TIMED_OUT` if no byte came in
  `timeout` (the exchange stays usable; zero or less polls), waiting for the head first within it.
  EOF before the body's end raises `StreamClosedEarly` saying where; bad framing, `ProtocolError`.
  `app._async.fetch` reads a body wanted whole over these calls, under `domain.bodies`' limits.
- `Exchange.close()` closes the connection (cancelling generation on the server); idempotent, it
  never raises. After it, `head` (if the head had not come) and `read` raise `StreamClosedEarly`.
- `Exchange.abort()` may be called from any thread while another is blocked in `head` or `read`:
  it shuts the connection down so that call returns at once (raising `StreamClosedEarly`); it
  never raises, and the owner still calls `close()`.
- No `OSError` escapes: every socket failure is mapped to a `domain.errors.InferError`.

`AsyncTransport` and `AsyncExchange` are the same contract for asyncio: `open`, `head` and `read`
are awaited; `close()` and `abort()` act on the socket at once, safe in a cancelled task's
`finally` and from another thread. Cancelling the awaiting task ends the wait too, and its owner's
`close()` then closes the connection. Nothing blocks the event loop.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable


class TimedOut(enum.Enum):
    """The result of a wait that saw no byte within its timeout; the connection is still usable.
    One member, so `x is TIMED_OUT` and `isinstance(x, TimedOut)` say the same and both narrow."""

    TIMED_OUT = "timed out"

    def __repr__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT: Final = TimedOut.TIMED_OUT


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """Status and headers. Header names are lower-cased; values are as sent."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    # Each name's first value, for `header`: looked up once per framing or type question.
    _first: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        first: dict[str, str] = {}
        for key, value in self.headers:
            first.setdefault(key, value)
        object.__setattr__(self, "_first", first)

    def header(self, name: str) -> str | None:
        """The first value of the header `name` (any case), or None."""
        return self._first.get(name.lower())


@runtime_checkable
class Exchange(Protocol):
    @property
    def what(self) -> str: ...

    def head(self, timeout: float) -> ResponseHead | TimedOut: ...

    def read(self, timeout: float) -> bytes | TimedOut: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class CancelSignal(Protocol):
    """What a call's cancellation offers the I/O: `on_cancel(wake)` runs `wake` when the call is
    cancelled (at once if it already is) and returns a function that unregisters it."""

    def on_cancel(self, wake: Callable[[], None]) -> Callable[[], None]: ...


class Link(Protocol):
    """A connection made ahead of its request (`Transport.connect`), nothing sent on it yet."""

    def close(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    def connect(self, timeout: float, cancel: CancelSignal | None = None) -> Link: ...

    def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
        cancel: CancelSignal | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        link: Link | None = None,
    ) -> Exchange: ...


@runtime_checkable
class AsyncExchange(Protocol):
    @property
    def what(self) -> str: ...

    async def head(self, timeout: float) -> ResponseHead | TimedOut: ...

    async def read(self, timeout: float) -> bytes | TimedOut: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


@runtime_checkable
class AsyncTransport(Protocol):
    async def connect(self, timeout: float, cancel: CancelSignal | None = None) -> Link: ...

    async def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
        cancel: CancelSignal | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        link: Link | None = None,
    ) -> AsyncExchange: ...
