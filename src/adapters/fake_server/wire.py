"""What a script puts on the wire and when, and the request read off it: shared by the fake
server on a Unix socket and the in-memory stream, so both replay a script byte for byte alike.

`on_wire(script)` turns a script into writes, each some seconds after the one before it (the
first: after the whole request arrived), then the script's end some seconds after the last
write. Pieces due at the same moment go out as one write; a piece with empty data is a delay
only. A `Reply` writes its head (after `head_delay_s`), each piece framed (a chunk, if chunked),
and, when it ends with `End.CLOSE`, a chunked body's terminating zero-size chunk.

`RequestReader` is sans-IO: the bytes of one request in, a `RecordedRequest` out once whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import h11

from adapters.fake_server.script import End, Piece, Raw, RecordedRequest, Script

_LAST_CHUNK = b"0\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Wire:
    """`writes`: `(after_s, data)` with `data` never empty; `end` comes `end_after_s` after the
    last write (after the request, if there is none). A delay may be `math.inf`: never."""

    writes: tuple[tuple[float, bytes], ...]
    end_after_s: float
    end: End


def on_wire(script: Script) -> Wire:
    if isinstance(script, Raw):
        return _paced(0.0, b"", script.pieces, bytes, b"", script.end)
    tail = _LAST_CHUNK if script.chunked and script.end is End.CLOSE else b""
    return _paced(
        script.head_delay_s, script.wire_head(), script.pieces, script.wire_piece, tail, script.end
    )


def _paced(
    delay: float,
    pending: bytes,
    pieces: Sequence[Piece],
    frame: Callable[[bytes], bytes],
    tail: bytes,
    end: End,
) -> Wire:
    writes: list[tuple[float, bytes]] = []
    for piece in pieces:
        if piece.delay_s > 0:
            if pending:
                writes.append((delay, pending))
                pending, delay = b"", 0.0
            delay += piece.delay_s
        if piece.data:
            pending += frame(piece.data)
    pending += tail
    if pending:
        writes.append((delay, pending))
        delay = 0.0
    return Wire(tuple(writes), delay, end)


class RequestReader:
    """One request, parsed by h11 as it arrives. `feed` raises `h11.RemoteProtocolError` for
    malformed bytes; `now` is the time recorded if these bytes complete the request."""

    def __init__(self) -> None:
        self._parser = h11.Connection(h11.SERVER)
        self._head: h11.Request | None = None
        self._body = bytearray()

    def feed(self, data: bytes, now: float) -> RecordedRequest | None:
        """The request once `data` completes it, else None (bytes after it are ignored)."""
        parser = self._parser
        parser.receive_data(data)
        while True:
            event = parser.next_event()
            if event is h11.NEED_DATA:
                return None
            if isinstance(event, h11.Request):
                self._head = event
            elif isinstance(event, h11.Data):
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                head = self._head
                assert head is not None
                return RecordedRequest(
                    method=head.method.decode("ascii"),
                    target=head.target.decode("ascii"),
                    headers=tuple(
                        (k.decode("ascii"), v.decode("latin-1")) for k, v in head.headers
                    ),
                    body=bytes(self._body),
                    time=now,
                )
            else:  # pragma: no cover - only after the request or at EOF, which callers never feed
                return None
