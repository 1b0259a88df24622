"""In-memory fakes for unit tests: a clock that moves only when told, a transport that replays
the same scripts as `FakeServer` without sockets, and a slot probe with states set by hand.

How `ScriptedTransport` replays a script: at `open` the script is compiled into a schedule of
steps (head, body piece, clean end, cut, protocol failure, silence), each at a time relative to
the open. A wait for the next step either reaches it within the caller's timeout (the clock
jumps to the step) or does not (the clock jumps by the whole timeout and the call returns
`TIMED_OUT`). So a piece's delay advances the fake clock, and a read whose timeout is shorter
than the next piece's delay costs exactly its timeout. A `Raw` script is parsed with h11, the
library the real adapter uses, so hostile bytes fail here as they fail on a socket.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import h11

from adapters.fake_server.script import End, Raw, RecordedRequest, Reply, RouteItem, Routes, RouteSpec, Script
from domain.errors import ConnectError, ProtocolError, Stalled, StreamClosedEarly
from ports.slot_probe import SlotState
from ports.transport import TIMED_OUT, ResponseHead, TimedOut


class FakeClock:
    """A monotonic clock for tests: `sleep` and `advance` move it at once; nothing else does."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        if wake is None or not wake.is_set():
            self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds} s)")
        with self._lock:
            self._now += seconds


class _Kind(enum.Enum):
    HEAD = "head"
    DATA = "data"
    END = "end"  # the body ended cleanly
    CUT = "cut"  # EOF before the body's end: StreamClosedEarly
    FAIL = "fail"  # malformed bytes: ProtocolError
    SILENCE = "silence"  # nothing more, ever


_TERMINAL = frozenset({_Kind.END, _Kind.CUT, _Kind.FAIL, _Kind.SILENCE})


@dataclass(frozen=True, slots=True)
class _Step:
    at: float
    kind: _Kind
    data: bytes = b""
    head: ResponseHead | None = None
    message: str = ""


class ScriptedTransport:
    """The `Transport` port over scripts instead of a socket. `refusing = True` makes `open` fail
    as a socket with nobody listening does."""

    def __init__(
        self,
        clock: FakeClock,
        routes: Mapping[tuple[str, str], RouteSpec] | None = None,
        *,
        socket_path: str = "/fake/llama.sock",
        header_bytes: int = 16384,
        default: RouteItem | None = None,
    ) -> None:
        self.clock = clock
        self.routes = Routes(routes)
        if default is not None:
            self.routes.set_default(default)
        self.socket_path = socket_path
        self.header_bytes = header_bytes
        self.refusing = False
        self.requests: list[RecordedRequest] = []

    def route(self, method: str, path: str, *replies: RouteItem) -> None:
        self.routes.set(method, path, *replies)

    def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
    ) -> ScriptedExchange:
        if self.refusing:
            raise ConnectError(
                f"cannot connect to {self.socket_path}: connection refused (nobody is listening on the socket)"
            )
        headers = [("host", "localhost")]
        if body is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
        headers.append(("connection", "close"))
        request = RecordedRequest(method, path, tuple(headers), body or b"", self.clock.now())
        self.requests.append(request)
        script = self.routes.reply_for(request)
        what = f"{method} {path}"
        steps = _compile_raw(script, method, self.header_bytes, what) if isinstance(script, Raw) else _compile_reply(
            script, self.header_bytes, what
        )
        return ScriptedExchange(self.clock, steps, request, what)


class ScriptedExchange:
    def __init__(self, clock: FakeClock, steps: list[_Step], request: RecordedRequest, what: str) -> None:
        self._clock = clock
        self._steps = steps
        self._index = 0
        self._start = clock.now()
        self._request = request
        self._what = what
        self._head: ResponseHead | None = None
        self._ended = False
        self._closed = False

    def __enter__(self) -> ScriptedExchange:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def head(self, timeout: float) -> ResponseHead | TimedOut:
        if self._head is not None:
            return self._head
        if self._closed:
            raise StreamClosedEarly(f"{self._what}: exchange already closed")
        step = self._next(timeout)
        if step is None:
            return TIMED_OUT
        if step.kind is _Kind.HEAD:
            assert step.head is not None
            self._head = step.head
            return step.head
        raise self._failure(step)

    def read(self, timeout: float) -> bytes | TimedOut:
        if self._ended:
            return b""
        if self._closed:
            raise StreamClosedEarly(f"{self._what}: exchange already closed")
        if self._head is None:
            start = self._clock.now()
            if self.head(timeout) is TIMED_OUT:
                return TIMED_OUT
            timeout -= self._clock.now() - start
        step = self._next(timeout)
        if step is None:
            return TIMED_OUT
        if step.kind is _Kind.DATA:
            return step.data
        if step.kind is _Kind.END:
            self._ended = True
            return b""
        raise self._failure(step)

    def read_all(self, limit: int, timeout: float) -> bytes:
        clock = self._clock
        deadline = clock.now() + timeout
        head = self.head(timeout)
        if isinstance(head, TimedOut):
            raise Stalled(f"{self._what}: no response head within {timeout} s")
        length = head.header("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise ProtocolError(f"{self._what}: Content-Length {length} is over the {limit}-byte body limit")
        parts: list[bytes] = []
        total = 0
        while True:
            piece = self.read(max(deadline - clock.now(), 0.0))
            if isinstance(piece, TimedOut):
                raise Stalled(f"{self._what}: body incomplete after {timeout} s ({total} bytes read)")
            if not piece:
                return b"".join(parts)
            total += len(piece)
            if total > limit:
                raise ProtocolError(f"{self._what}: body over the {limit}-byte limit")
            parts.append(piece)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._request.mark_closed(self._clock.now())

    def abort(self) -> None:
        self.close()

    def _next(self, timeout: float) -> _Step | None:
        """The next step if it is due within `timeout` (the clock moves to it), else None (the
        clock moves by `timeout`). Terminal steps stay current, so failures repeat."""
        timeout = max(timeout, 0.0)
        step = self._steps[self._index]
        clock = self._clock
        wait = self._start + step.at - clock.now()
        if step.kind is _Kind.SILENCE or wait > timeout:
            clock.advance(timeout)
            return None
        if wait > 0:
            clock.advance(wait)
        if step.kind not in _TERMINAL:
            self._index += 1
        return step

    def _failure(self, step: _Step) -> Exception:
        if step.kind is _Kind.FAIL:
            return ProtocolError(f"{self._what}: {step.message}")
        return StreamClosedEarly(f"{self._what}: {step.message}")


def _compile_reply(reply: Reply, header_bytes: int, what: str) -> list[_Step]:
    at = reply.head_delay_s
    if math.isinf(at):
        return [_Step(0.0, _Kind.SILENCE)]
    wire = reply.wire_headers()
    head = ResponseHead(reply.status, tuple((name.lower(), value) for name, value in wire))
    if len(reply.wire_head()) > header_bytes:
        return [_Step(at, _Kind.FAIL, message=f"response head over the {header_bytes}-byte limit")]
    if reply.chunked and head.header("content-length") is not None:
        return [_Step(at, _Kind.FAIL, message="response has both Transfer-Encoding and Content-Length")]
    steps = [_Step(at, _Kind.HEAD, head=head)]
    length = reply.content_length()
    sent = 0
    if length == 0:
        return [*steps, _Step(at, _Kind.END)]
    for piece in reply.pieces:
        at += piece.delay_s
        data = piece.data
        if not data:
            continue
        if length is not None:
            data = data[: length - sent]
        sent += len(data)
        steps.append(_Step(at, _Kind.DATA, data))
        if length is not None and sent >= length:
            return [*steps, _Step(at, _Kind.END)]
    if reply.end is End.SILENCE:
        return [*steps, _Step(at, _Kind.SILENCE)]
    if length is None:
        if reply.end is End.CLOSE:
            return [*steps, _Step(at, _Kind.END)]
        message = f"connection closed inside a chunked body after {sent} body bytes"
        return [*steps, _Step(at, _Kind.CUT, message=message)]
    return [
        *steps,
        _Step(at, _Kind.CUT, message=f"connection closed: content-length short, {sent} of {length} bytes received"),
    ]


def _compile_raw(raw: Raw, method: str, header_bytes: int, what: str) -> list[_Step]:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=header_bytes)
    conn.send(h11.Request(method=method, target="/", headers=[("Host", "localhost"), ("Connection", "close")]))
    conn.send(h11.EndOfMessage())
    steps: list[_Step] = []
    fed = 0
    body = 0
    at = 0.0

    def drain(eof: bool) -> bool:
        # Move every event h11 can produce now into the schedule; False once the schedule ended.
        nonlocal body
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                has_head = any(step.kind is _Kind.HEAD for step in steps)
                if eof:
                    where = f"after {body} body bytes" if has_head else f"inside the response head after {fed} bytes"
                    steps.append(_Step(at, _Kind.CUT, message=f"connection closed {where}"))
                else:
                    steps.append(_Step(at, _Kind.FAIL, message=f"malformed response: {exc}"))
                return False
            if event is h11.NEED_DATA:
                return True
            if isinstance(event, h11.Response):
                size = fed - len(conn.trailing_data[0])
                head = ResponseHead(
                    event.status_code,
                    tuple((k.decode("ascii"), v.decode("latin-1")) for k, v in event.headers),
                )
                if size > header_bytes:
                    steps.append(_Step(at, _Kind.FAIL, message=f"response head over the {header_bytes}-byte limit"))
                    return False
                if head.header("transfer-encoding") is not None and head.header("content-length") is not None:
                    steps.append(
                        _Step(at, _Kind.FAIL, message="response has both Transfer-Encoding and Content-Length")
                    )
                    return False
                steps.append(_Step(at, _Kind.HEAD, head=head))
            elif isinstance(event, h11.Data):
                body += len(event.data)
                steps.append(_Step(at, _Kind.DATA, bytes(event.data)))
            elif not isinstance(event, h11.InformationalResponse):  # EndOfMessage (or ConnectionClosed)
                steps.append(_Step(at, _Kind.END))
                return False

    for piece in raw.pieces:
        at += piece.delay_s
        if piece.data:
            fed += len(piece.data)
            conn.receive_data(piece.data)
            if not drain(eof=False):
                return steps
    if raw.end is End.SILENCE:
        return [*steps, _Step(at, _Kind.SILENCE)]
    conn.receive_data(b"")
    drain(eof=True)
    if not steps or steps[-1].kind not in _TERMINAL:  # pragma: no cover - h11 always ends at EOF
        steps.append(_Step(at, _Kind.CUT, message="connection closed"))
    return steps


class FakeSlotProbe:
    """The `SlotProbe` port with states set by hand; records every slot it was asked about."""

    def __init__(self, states: Mapping[int, SlotState] | None = None) -> None:
        self.states: dict[int, SlotState] = dict(states or {})
        self.asked: list[int] = []

    def state(self, slot: int) -> SlotState:
        if slot < 0:
            raise ValueError(f"slot ids are never negative, got {slot}")
        self.asked.append(slot)
        return self.states.get(slot, SlotState.UNAVAILABLE)


__all__ = ["FakeClock", "FakeSlotProbe", "Script", "ScriptedExchange", "ScriptedTransport"]
