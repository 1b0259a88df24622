"""One HTTP exchange on one Unix-socket connection.

The contract, which the real adapter and the in-memory fake both meet (one contract suite runs
against each):

- `Transport.open(method, path, body, timeout)` connects, sends the whole request and returns an
  `Exchange`. It raises `domain.errors.ConnectError` (naming the socket path) if the socket
  cannot be reached, and `domain.errors.StreamClosedEarly` if the connection breaks while the
  request is being written.
- `Exchange.head(timeout)` waits up to `timeout` seconds for the status line and headers. It
  returns a `ResponseHead`, or `TIMED_OUT` if nothing complete arrived in time; a timeout leaves
  the exchange usable, so the caller may poll elsewhere and call `head` again. Once the head is
  returned, later calls return the same head at once.
- `Exchange.read(timeout)` returns the next piece of the de-framed body (chunked, content-length
  and read-to-close bodies are all handled), `b""` if and only if the body ended cleanly, or
  `TIMED_OUT` if no byte arrived within `timeout` (the exchange stays usable). EOF before the
  body's end raises `StreamClosedEarly`; malformed framing or a head over its size cap raises
  `ProtocolError`. The timeout may differ on every call.
- `Exchange.read_all(limit)` reads the rest of the body, raising `ProtocolError` if it exceeds
  `limit` bytes (used for bodies that are not streams, and for error bodies).
- `Exchange.close()` closes the connection (cancelling generation on the server); it is
  idempotent and never raises. After close, `head`/`read` raise `StreamClosedEarly`.
- `Exchange.abort()` may be called from any thread while another is blocked in `head` or
  `read`: it shuts the connection down so that call returns at once (raising
  `StreamClosedEarly`); it never raises, and the owner still calls `close()`.
- No `OSError` escapes: every socket failure is mapped to a `domain.errors.InferError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol, final, runtime_checkable


@final
class TimedOut:
    """The result of a read that saw no byte within its timeout; the connection is still usable."""

    _instance: TimedOut | None = None

    def __new__(cls) -> TimedOut:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT: Final = TimedOut()


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """Status and headers. Header names are lower-cased; values are as sent."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key == name:
                return value
        return None


@runtime_checkable
class Exchange(Protocol):
    def head(self, timeout: float) -> ResponseHead | TimedOut: ...

    def read(self, timeout: float) -> bytes | TimedOut: ...

    def read_all(self, limit: int, timeout: float) -> bytes: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
    ) -> Exchange: ...
