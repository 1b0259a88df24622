"""Scripts for the fake server, as data: what to send on one connection, and when.

A `Reply` is a structured answer (status, headers, body pieces each after a delay, then an end);
a `Raw` is bytes sent verbatim (a recorded response, or a hostile one). Both the Unix-socket
`FakeServer` and the in-memory `ScriptedTransport` replay the same scripts, so a test can move
between them without rewriting its script.

Timing: a `Reply`'s head is sent `head_delay_s` after the request arrived; each piece is sent
`delay_s` after the one before it (the first after the head). Pieces with empty data are delays
only (in a chunked body an empty chunk would end the body).

Ends:
- `End.CLOSE`: finish the framing (the zero-size chunk of a chunked body) and close.
- `End.RESET`: cut the connection where it is, without finishing the framing. On a Unix socket a
  cut reads as EOF; the client tells it from a clean end by the framing (a chunked body without
  its last chunk, a short content-length body).
- `End.SILENCE`: send nothing more and hold the connection open until the client closes it or
  the server stops.
"""

from __future__ import annotations

import enum
import http
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import orjson


class End(enum.Enum):
    CLOSE = "close"
    RESET = "reset"
    SILENCE = "silence"


@dataclass(frozen=True, slots=True)
class Piece:
    delay_s: float
    data: bytes

    def __post_init__(self) -> None:
        if not self.delay_s >= 0:
            raise ValueError(f"a piece's delay must be >= 0, got {self.delay_s}")


@dataclass(frozen=True, slots=True)
class Reply:
    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    pieces: Sequence[Piece] = ()
    end: End = End.CLOSE
    chunked: bool = False
    head_delay_s: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", tuple(self.headers))
        object.__setattr__(self, "pieces", tuple(self.pieces))
        if not self.head_delay_s >= 0:
            raise ValueError(
                f"head_delay_s must be >= 0 (math.inf: never), got {self.head_delay_s}"
            )

    @property
    def body_length(self) -> int:
        return sum(len(piece.data) for piece in self.pieces)

    def wire_headers(self) -> tuple[tuple[str, str], ...]:
        """The headers as sent: the script's, plus the framing and `Connection: close`."""
        names = {name.lower() for name, _ in self.headers}
        extra: list[tuple[str, str]] = []
        if self.chunked:
            if "transfer-encoding" not in names:
                extra.append(("Transfer-Encoding", "chunked"))
        elif "content-length" not in names:
            extra.append(("Content-Length", str(self.body_length)))
        if "connection" not in names:
            extra.append(("Connection", "close"))
        return (*self.headers, *extra)

    def wire_head(self) -> bytes:
        reason = self.reason or _reason_phrase(self.status)
        lines = [f"HTTP/1.1 {self.status} {reason}"]
        lines += [f"{name}: {value}" for name, value in self.wire_headers()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def wire_piece(self, data: bytes) -> bytes:
        if self.chunked:
            return b"%x\r\n%s\r\n" % (len(data), data)
        return data


@dataclass(frozen=True, slots=True)
class Raw:
    """Bytes sent exactly as given (head included), each piece after its delay, then `end`."""

    pieces: Sequence[Piece] = ()
    end: End = End.CLOSE

    def __post_init__(self) -> None:
        object.__setattr__(self, "pieces", tuple(self.pieces))


Script: TypeAlias = Reply | Raw


@dataclass(eq=False)
class RecordedRequest:
    """One request as the server received it. `client_closed` is set once the server saw the
    client close its end (EOF or a failed write), with the time in `closed_at`."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    time: float
    client_closed: threading.Event = field(default_factory=threading.Event, repr=False)
    closed_at: float | None = None

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def json(self) -> Any:
        return orjson.loads(self.body)

    def mark_closed(self, when: float) -> None:
        if not self.client_closed.is_set():
            self.closed_at = when
            self.client_closed.set()


Handler: TypeAlias = Callable[[RecordedRequest], Script]
RouteItem: TypeAlias = Script | Handler
RouteSpec: TypeAlias = RouteItem | Sequence[RouteItem]


class Routes:
    """(method, path without query) to a queue of replies: one per connection, the last one
    repeating. A callable in the queue is asked for the reply with the recorded request.
    Unrouted requests get llama-server's 404. Safe to change while a server runs."""

    def __init__(self, routes: Mapping[tuple[str, str], RouteSpec] | None = None) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str], deque[RouteItem]] = {}
        self._default: RouteItem | None = None
        for (method, path), spec in (routes or {}).items():
            items = (spec,) if isinstance(spec, Reply | Raw) or callable(spec) else tuple(spec)
            self.set(method, path, *items)

    def set(self, method: str, path: str, *replies: RouteItem) -> None:
        if not replies:
            raise ValueError(f"route {method} {path} needs at least one reply")
        with self._lock:
            self._queues[(method.upper(), path)] = deque(replies)

    def set_default(self, reply: RouteItem | None) -> None:
        with self._lock:
            self._default = reply

    def reply_for(self, request: RecordedRequest) -> Script:
        with self._lock:
            queue = self._queues.get((request.method.upper(), request.path))
            if queue is None:
                item = self._default if self._default is not None else not_found()
            else:
                item = queue.popleft() if len(queue) > 1 else queue[0]
        if isinstance(item, Reply | Raw):
            return item
        return item(request)


# -- script builders ------------------------------------------------------------------------------

# As recorded from llama-server; `Reply.wire_headers` appends the framing and `Connection: close`
# in the same order it does.
SSE_HEADERS: tuple[tuple[str, str], ...] = (
    ("Server", "llama.cpp"),
    ("Access-Control-Allow-Origin", ""),
    ("X-Accel-Buffering", "no"),
    ("Content-Type", "text/event-stream"),
)
JSON_HEADERS: tuple[tuple[str, str], ...] = (
    ("Server", "llama.cpp"),
    ("Access-Control-Allow-Origin", ""),
    ("Content-Type", "application/json; charset=utf-8"),
)


def sse_event(item: Mapping[str, Any] | str | bytes) -> bytes:
    """One SSE event: a dict as `data: <json>`, a str as `data: <str>`, bytes verbatim."""
    if isinstance(item, bytes):
        return item
    text = item if isinstance(item, str) else orjson.dumps(item).decode()
    return b"data: " + text.encode() + b"\n\n"


def sse_reply(
    chunks: Iterable[Mapping[str, Any] | str | bytes],
    *,
    delay_s: float = 0.0,
    done: bool = True,
    end: End = End.CLOSE,
    head_delay_s: float = 0.0,
    status: int = 200,
    headers: Sequence[tuple[str, str]] = SSE_HEADERS,
) -> Reply:
    """A chunked SSE stream shaped like llama-server's: one event per chunk, each `delay_s` after
    the one before, then `data: [DONE]` unless `done` is False."""
    pieces = [Piece(delay_s, sse_event(chunk)) for chunk in chunks]
    if done:
        pieces.append(Piece(delay_s, b"data: [DONE]\n\n"))
    return Reply(status, headers, pieces, end=end, chunked=True, head_delay_s=head_delay_s)


def json_reply(
    obj: Any, status: int = 200, *, head_delay_s: float = 0.0, delay_s: float = 0.0
) -> Reply:
    return Reply(
        status, JSON_HEADERS, [Piece(delay_s, orjson.dumps(obj))], head_delay_s=head_delay_s
    )


def error_reply(status: int, message: str, type_: str = "server_error") -> Reply:
    """An error in llama-server's shape: `{"error": {"code", "message", "type"}}`."""
    return json_reply({"error": {"code": status, "message": message, "type": type_}}, status)


def not_found() -> Reply:
    return error_reply(404, "File Not Found", "not_found_error")


def loading() -> Reply:
    """What every route answers while the model loads."""
    return error_reply(503, "Loading model", "unavailable_error")


def slots_reply(busy: Sequence[bool], *, n_ctx: int = 4096) -> Reply:
    """`GET /slots` with one entry per slot, `is_processing` as given."""
    slots = [
        {"id": index, "n_ctx": n_ctx, "speculative": False, "is_processing": flag}
        for index, flag in enumerate(busy)
    ]
    return json_reply(slots)


def silence() -> Raw:
    """Accept the request and never answer: no head, no ping, until the client gives up."""
    return Raw((), End.SILENCE)


def raw_reply(
    raw: bytes,
    *,
    delay_s: float = 0.0,
    piece_bytes: int | None = None,
    end: End = End.CLOSE,
) -> Raw:
    """A recorded response served verbatim, paced: each piece `delay_s` after the one before.

    Pieces are `piece_bytes` long if given; otherwise the head is one piece and each chunk of a
    chunked body one more (a body that is not chunked is one piece), which is how llama-server
    writes a stream.
    """
    if piece_bytes is not None:
        if piece_bytes < 1:
            raise ValueError(f"piece_bytes must be positive, got {piece_bytes}")
        parts = [raw[i : i + piece_bytes] for i in range(0, len(raw), piece_bytes)]
    else:
        parts = split_recorded(raw)
    return Raw([Piece(delay_s, part) for part in parts], end)


def split_recorded(raw: bytes) -> list[bytes]:
    """Cut a raw response into its head and the chunks of a chunked body, as written.

    Bytes that do not parse as chunks are kept whole in the last piece; the concatenation of the
    pieces is always exactly `raw`."""
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        return [raw] if raw else []
    pos = head_end + 4
    parts = [raw[:pos]]
    if b"chunked" not in raw[:pos].lower():
        return parts + ([raw[pos:]] if pos < len(raw) else [])
    while pos < len(raw):
        line_end = raw.find(b"\r\n", pos)
        try:
            size = int(raw[pos:line_end].split(b";", 1)[0], 16) if line_end >= 0 else -1
        except ValueError:
            size = -1
        if size < 0:
            break
        stop = len(raw) if size == 0 else min(line_end + 2 + size + 2, len(raw))
        parts.append(raw[pos:stop])
        pos = stop
    if pos < len(raw):
        parts.append(raw[pos:])
    return parts


def _reason_phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


NEVER = math.inf
"""`head_delay_s=NEVER`: the head is never sent (a request queued behind a busy slot)."""
