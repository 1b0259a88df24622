"""Response bodies de-framed sans-IO: chunked, content-length, read-to-close, and none.

h11 parses and validates the status line and headers; the body is read here because h11's
per-event machinery costs about 5 µs per chunk, more than the rest of the streaming client
together (measured in `bench/decode_bench.py`). The chunked reader is tested against h11 as an
oracle on arbitrary input.

Interface of every reader: `push(data)` appends received bytes; `pull()` returns the next piece
of body (`bytes`, never empty), `b""` once the body ended cleanly, or `None` when it needs more
bytes; `eof()` records that the peer closed, after which `pull()` either finishes (a
read-to-close body) or raises `StreamClosedEarly` saying where the body was cut.

Invariants:
- `_buf[_pos:]` is the unread input; a read that times out changes nothing, so the reader is
  never corrupted by a timeout.
- A chunk's data is handed out as soon as any of it is buffered (a chunk larger than a read is
  handed out in pieces); a whole buffered chunk is one piece, which is how llama-server writes
  one SSE event.
- Tiny chunks cost no more per byte than big ones: a chunk under `SMALL_CHUNK` bytes is handed
  out together with the tiny chunks buffered right behind it, up to `GATHER_BYTES` in one piece,
  so a server that sends one byte per chunk costs one piece per receive, not one per byte. A
  framing error or a cut behind them is raised by the next `pull`, after the bytes before it.
- Chunk-size lines and trailers are capped at `line_limit` bytes (the header limit), chunk
  sizes at 16 hex digits; anything else malformed is a `ProtocolError` naming the chunk.
"""

from __future__ import annotations

import re
from typing import Final, NoReturn

from domain.errors import ProtocolError, StreamClosedEarly

_HEX: Final = b"0123456789abcdefABCDEF"
# chunk-size [ BWS ; chunk-ext ] with chunk-ext any visible text (extensions are ignored)
_SIZE_LINE: Final = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(;[\t\x20-\x7e\x80-\xff]*)?")
_TRAILER_LINE: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*")

_SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)

# llama-server's chunks are whole SSE events, never this small: only a server that splits its
# body into tiny chunks has them gathered (see the module's invariants).
SMALL_CHUNK: Final = 64
GATHER_BYTES: Final = 65536


class BodyReader:
    """The read-to-close body: everything until EOF. The base of the other readers."""

    __slots__ = ("_buf", "_eof", "_pos", "_what", "received")

    def __init__(self, what: str, buffered: bytes = b"") -> None:
        self._what = what
        self._buf = buffered
        self._pos = 0
        self._eof = False
        self.received = 0  # body bytes handed out

    def push(self, data: bytes) -> None:
        pos = self._pos
        if pos >= len(self._buf):
            self._buf = data
        else:
            self._buf = self._buf[pos:] + data
        self._pos = 0

    def eof(self) -> None:
        self._eof = True

    def pull(self) -> bytes | None:
        buf = self._buf
        pos = self._pos
        if pos < len(buf):
            piece = buf[pos:] if pos else buf
            self._pos = len(buf)
            self.received += len(piece)
            return piece
        return b"" if self._eof else None

    def where(self) -> str:
        return f"inside the body after {self.received} bytes"


class EmptyBody(BodyReader):
    """No body: a HEAD response, 1xx, 204 or 304."""

    __slots__ = ()

    def pull(self) -> bytes | None:
        return b""


class LengthBody(BodyReader):
    """A `Content-Length` body; bytes after it are ignored (the connection closes anyway)."""

    __slots__ = ("_length",)

    def __init__(self, what: str, length: int, buffered: bytes = b"") -> None:
        super().__init__(what, buffered)
        self._length = length

    def pull(self) -> bytes | None:
        left = self._length - self.received
        if not left:
            return b""
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail <= 0:
            if self._eof:
                raise StreamClosedEarly(f"{self._what}: connection closed {self.where()}")
            return None
        take = left if avail > left else avail
        piece = buf if take == len(buf) else buf[pos : pos + take]
        self._pos = pos + take
        self.received += take
        return piece

    def where(self) -> str:
        return (
            "inside the body: content-length short,"
            f" {self.received} of {self._length} bytes received"
        )


class ChunkedBody(BodyReader):
    """A `Transfer-Encoding: chunked` body. Extensions and trailers are accepted and ignored."""

    __slots__ = ("_chunks", "_fault", "_left", "_line_limit", "_size", "_state", "_trailer_bytes")

    def __init__(self, what: str, line_limit: int, buffered: bytes = b"") -> None:
        super().__init__(what, buffered)
        self._line_limit = line_limit
        self._state = _SIZE
        self._left = 0  # bytes of the current chunk not yet handed out
        self._size = 0  # size of the current chunk
        self._chunks = 0  # chunks started
        self._trailer_bytes = 0
        self._fault: ProtocolError | StreamClosedEarly | None = None  # found behind gathered chunks

    def pull(self) -> bytes | None:
        if self._fault is not None:
            raise self._fault
        piece = self._next_chunk()
        if not piece or len(piece) >= SMALL_CHUNK:
            return piece
        pieces = [piece]
        total = len(piece)
        while total < GATHER_BYTES:
            try:
                more = self._next_chunk()
            except (ProtocolError, StreamClosedEarly) as exc:
                self._fault = exc  # raised by the next pull, after these bytes
                break
            if not more:
                break  # needs more input, or the body ended: the next pull says so again
            pieces.append(more)
            total += len(more)
            if len(more) >= SMALL_CHUNK:
                break
        return piece if len(pieces) == 1 else b"".join(pieces)

    def _next_chunk(self) -> bytes | None:
        while True:
            state = self._state
            buf = self._buf
            pos = self._pos
            if state == _DATA:
                avail = len(buf) - pos
                if avail <= 0:
                    return self._starve()
                left = self._left
                if avail >= left:
                    piece = buf[pos : pos + left]
                    self._pos = pos + left
                    self._left = 0
                    self._state = _CRLF
                    self.received += left
                    return piece
                piece = buf[pos:] if pos else buf
                self._pos = len(buf)
                self._left = left - avail
                self.received += avail
                return piece
            if state == _CRLF:
                if len(buf) - pos < 2:
                    if buf[pos:] not in (b"", b"\r"):
                        self._fail(
                            f"chunk {self._chunks} ({self._size} bytes) not followed by CRLF"
                        )
                    return self._starve()
                if buf[pos : pos + 2] != b"\r\n":
                    self._fail(f"chunk {self._chunks} ({self._size} bytes) not followed by CRLF")
                self._pos = pos + 2
                self._state = _SIZE
            elif state == _SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if len(buf) - pos > self._line_limit:
                        self._fail_after(f"chunk size line over {self._line_limit} bytes")
                    return self._starve()
                line = buf[pos:end]
                # Plain hex digits are the common case; anything else goes through the regex.
                plain = len(line) <= 16 and line and not line.strip(_HEX)
                size = int(line, 16) if plain else self._size_from(line)
                self._pos = end + 2
                if size:
                    self._chunks += 1
                    self._size = self._left = size
                    self._state = _DATA
                else:
                    self._state = _TRAILER
            elif state == _TRAILER:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if self._trailer_bytes + len(buf) - pos > self._line_limit:
                        self._fail_after(f"trailers over {self._line_limit} bytes")
                    return self._starve()
                self._pos = end + 2
                if end == pos:
                    self._state = _DONE
                    return b""
                self._trailer_bytes += end - pos + 2
                if self._trailer_bytes > self._line_limit:
                    self._fail_after(f"trailers over {self._line_limit} bytes")
                if _TRAILER_LINE.fullmatch(buf, pos, end) is None:
                    self._fail_after(f"malformed trailer line {buf[pos:end][:40]!r}")
            else:
                return b""

    def _size_from(self, line: bytes) -> int:
        if len(line) > self._line_limit:
            self._fail_after(f"chunk size line over {self._line_limit} bytes")
        match = _SIZE_LINE.fullmatch(line)
        if match is None:
            digits = len(line) - len(line.lstrip(_HEX))
            if digits > 16:
                self._fail_after(f"chunk size of {digits} hex digits (over 16)")
            self._fail_after(f"malformed chunk size line {line[:40]!r}")
        return int(match.group(1), 16)

    def _starve(self) -> bytes | None:
        # Out of input: wait for more, or, at EOF, report where the body was cut.
        if self._eof:
            raise StreamClosedEarly(f"{self._what}: connection closed {self.where()}")
        return None

    def _fail(self, message: str) -> NoReturn:
        raise ProtocolError(f"{self._what}: {message}")

    def _fail_after(self, message: str) -> NoReturn:
        self._fail(f"{message} after {self._chunks} chunks")

    def where(self) -> str:
        state = self._state
        if state == _DATA:
            done = self._size - self._left
            return (
                f"inside chunk {self._chunks} after {done} of its {self._size} bytes"
                f" ({self.received} body bytes)"
            )
        if state == _TRAILER:
            return f"inside the trailers after {self._chunks} chunks"
        if self._chunks == 0:
            return "before the first chunk"
        return (
            f"after chunk {self._chunks} ({self.received} body bytes),"
            " before the terminating zero-size chunk"
        )
