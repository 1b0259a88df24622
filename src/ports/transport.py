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
  `open(..., link=link)` then sends its request on instead of connecting (the exchange owns it
  from then on; `open` closes it on every failure, a malformed request's included). It raises
  `ConnectError` as `open` would; a `Link` never used is closed by its owner (`close()`,
  idempotent, never raises). Both connect at once or fail at once, but for a socket whose
  accept backlog is full: that is waited out within `timeout` in either flavour, and `cancel`
  (or cancelling the task) ends the wait with `ConnectError`.
- A transport that keeps a proxy's connection limit makes a connect wait for a place (within
  `timeout`, or `open(..., place_wait=)`, and `cancel` ends that wait with `ConnectError`), and
  gives the place back when the connection closes; `connect` never waits for one: it takes a
  place free at once, or raises `ConnectError`. A transport without such a limit ignores
  `place_wait`.
- `Transport.open(..., cancel=signal)` ties the exchange to a call's cancellation: cancelling
  aborts it (even while the request is still being written), and closing it unregisters.
- `Exchange.what` names the request (`"GET /props"`); every error the exchange raises starts
  with it.
- `Exchange.head(timeout)` waits up to `timeout` seconds for the status line and headers. It
  returns a `ResponseHead`, or `TIMED_OUT` if nothing complete arrived in time; a timeout leaves
  the exchange usable, so the caller may poll elsewhere and call `head` again. Once the head is
  returned, later calls return the same head at once. A head over its size cap, or malformed,
  or with both `Transfer-Encoding` and `Content-Length`, raises `ProtocolError` (and keeps
  raising it); EOF before the head's end raises `StreamClosedEarly`.
- `Exchange.read(timeout)` returns the next piece of the de-framed body (chunked, content-length
  and read-to-close bodies are all handled), `b""` if and only if the body ended cleanly, or
  `TIMED_OUT` if no byte arrived within `timeout` (the exchange stays usable). It waits for the
  head first if need be, within the same `timeout`. EOF before the body's end raises
  `StreamClosedEarly` saying where; malformed framing raises `ProtocolError`. The timeout may
  differ on every call; zero or less polls.
- A body wanted whole (not a stream, or an error body) is read over these calls by the call code
  (`app._async.fetch`), under the rules of `domain.bodies`: one deadline and one size limit.
- `Exchange.close()` closes the connection (cancelling generation on the server); it is
  idempotent and never raises. After close, `head` (if the head had not come) and `read` raise
  `StreamClosedEarly`.
- `Exchange.abort()` may be called from any thread while another is blocked in `head` or
  `read`: it shuts the connection down so that call returns at once (raising
  `StreamClosedEarly`); it never raises, and the owner still calls `close()`.
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
        place_wait: float | None = None,
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
        place_wait: float | None = None,
    ) -> AsyncExchange: ...
