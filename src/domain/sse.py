"""Server-sent events, decoded sans-IO: bytes in (split anywhere), events out.

Follows the WHATWG event-stream algorithm, specialised to what a chat-completions stream needs.

Invariants:
- Lines end only at CR, LF or CRLF in the bytes, never at U+2028 or others `str.splitlines` splits
  on. A CR that ends one feed and an LF that starts the next are one line end (`_cr_pending`).
- Only complete lines are decoded. A line end is ASCII and cannot occur inside a multi-byte UTF-8
  sequence, so a character split across feeds is always whole by the time its line is decoded.
- `_tail` holds the incomplete last line; it never contains CR or LF. A feed that does not end
  that line is appended to it, and only the feed's own bytes are searched, so the cost is linear in
  the bytes received however they are split (a long line sent one byte per read costs what it
  costs in whole reads, per call). The line is joined and scanned once more when it ends.
- A feed's complete lines are walked in runs of non-blank lines of at most `_SPAN` bytes (or one
  longer line), each byte searched a bounded number of times; a run of `data:` lines is taken at
  once, so many short lines cost about what one long line does. An event's data is bounded
  (`domain.sse_data`): at most `max_line` bytes of values in at most `max_line` lines, so under
  `2 * max_line` bytes joined; one more byte or line is a `ProtocolError` naming the cap.
- An event is dispatched only at its blank line. At EOF an undispatched event or line is dropped
  (as the spec says) and `partial_event` records that there was one.
- `[DONE]` is recognised only as the exact data of a dispatched event. After it the decoder is
  finished: later bytes are ignored unparsed, so what follows the end marker cannot sway the result.
- Failure is sticky: once a feed has failed, every later call raises. Events completed earlier in
  the same feed are returned first and the error is raised by the next call (`feed(b"")` asks at
  once; `clean` is False meanwhile), so those events do not depend on how the bytes were split.
- The common case (whole `data: ...\\n\\n` events, no CR) costs one `split` and a few slices per
  event, and its `SseData` is made with no Python frame; nothing loops per byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeAlias

import orjson

from domain.errors import HttpError, InferError, ProtocolError, stream_error
from domain.sse_data import EventData

_BOM: Final = b"\xef\xbb\xbf"
_DONE: Final = b"[DONE]"
# A run's most bytes: a few calls a run, and little to walk line by line where a cap is passed.
_SPAN: Final = 1 << 16
_new_tuple: Final = tuple.__new__  # `_new_tuple(SseData, (text,))`: no Python frame


class SseData(NamedTuple):
    """A dispatched event's data: its `data:` lines joined with "\\n". A tuple: made per event,
    a frozen dataclass's `__init__` would cost each a sixth of a microsecond more."""

    data: str


@dataclass(frozen=True, slots=True)
class SseDone:
    """The event whose data is exactly `[DONE]`: the server's end of stream."""


@dataclass(frozen=True, slots=True)
class SseComment:
    """A comment line (`:` and what follows it), e.g. llama-server's keep-alive ping."""

    text: str


SseEvent: TypeAlias = SseData | SseDone | SseComment

SSE_DONE: Final = SseDone()


class SseDecoder:
    """Feed it body bytes as they arrive; it returns the events each feed completed.

    `feed(data)` returns the events completed by `data`, raising `ProtocolError` for a line over
    `max_line` bytes (also while the line is still incomplete), an event whose data exceeds
    `max_line`, or invalid UTF-8, and `HttpError` for the older `error:` field form of a
    mid-stream error. `end()` is called at EOF; it returns no events (an event without its blank
    line is never dispatched) and sets `partial_event` if the stream stopped inside one.
    """

    __slots__ = (
        "_cr_pending",
        "_data",
        "_done",
        "_ended",
        "_failure",
        "_failure_raised",
        "_max_line",
        "_started",
        "_tail",
        "clean",
        "partial_event",
    )

    def __init__(self, max_line: int = 1 << 20) -> None:
        if max_line < 1:
            raise ValueError(f"max_line must be positive, got {max_line}")
        self._max_line = max_line
        self._tail = bytearray()
        self._data = EventData(max_line)  # of the event being read
        self._cr_pending = False
        self._started = False
        self._done = False
        self._ended = False
        self._failure: InferError | None = None
        self._failure_raised = False
        self.partial_event = False
        # Read-only outside: nothing is pending (no partial line or event, no CR, not finished,
        # no failure, even one held back behind a feed's events), so `feed` may take a whole
        # event at once. So from the first feed: an event starting `data: ` has no BOM before.
        self.clean = True

    @property
    def done(self) -> bool:
        """True once `[DONE]` was dispatched; later input is ignored."""
        return self._done

    def feed(self, data: bytes) -> list[SseEvent]:
        if self.clean:
            # Fast path: whole one-line `data: ` events, as llama-server writes them (two at first).
            n = len(data)
            if data[:6] == b"data: " and data[n - 2 :] == b"\n\n" and b"\r" not in data:
                if data.find(b"\n") != n - 2:
                    events = self._whole_events(data)
                    if events is not None:
                        return events
                elif n - 2 <= self._max_line:
                    self._started = True  # a byte-order mark from now on is not the stream's first
                    value = data[6:-2]
                    if value == _DONE:
                        self._done = True
                        self.clean = False
                        return [SSE_DONE]
                    try:
                        return [_new_tuple(SseData, (value.decode("utf-8"),))]
                    except UnicodeDecodeError:
                        pass
        if self._failure is not None:
            self._raise_failure()
        if self._ended:
            raise ValueError("SseDecoder.feed() called after end()")
        if self._done or not data:
            return []
        if self._cr_pending:
            self._cr_pending = False
            if data[0] == 10:  # the LF of a CRLF split across two feeds
                data = data[1:]
                if not data:
                    return []
        tail = self._tail
        if tail:
            if self._started and b"\n" not in data and b"\r" not in data:
                self._line_goes_on(data)
                return []
            data = b"".join((tail, data))
            tail.clear()
        if not self._started:
            if len(data) < 3 and _BOM.startswith(data):
                tail += data  # may still become a byte-order mark
                return []
            self._started = True
            if data.startswith(_BOM):
                data = data[3:]
        if b"\r" in data:
            if data[-1] == 13:
                self._cr_pending = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = data.rfind(b"\n") + 1  # the complete lines end there
        if end < len(data):
            tail += data[end:]
        out: list[SseEvent] = []
        try:
            if end:
                self._lines(data, end, out)
            if len(tail) > self._max_line and not self._done:
                over = f"SSE line over {self._max_line} bytes"
                raise ProtocolError(f"{over} (still unterminated at {len(tail)} bytes)")
        except (ProtocolError, HttpError) as exc:
            self._failure = exc
            self.clean = False
            if out:
                return out  # the error is raised by the next call
            self._failure_raised = True
            raise
        self.clean = not (tail or self._data.lines or self._cr_pending or self._done)
        return out

    def _whole_events(self, data: bytes) -> list[SseEvent] | None:
        """`data` (no CR; `data: ` first, a blank line last) as whole one-line `data: ` events;
        None, nothing changed, for anything else or invalid UTF-8 before a `[DONE]`."""
        out: list[SseEvent] = []
        max_line = self._max_line
        for line in data[:-2].split(b"\n\n"):
            if line[:6] != b"data: " or b"\n" in line or len(line) > max_line:
                return None
            value = line[6:]
            if value == _DONE:  # the end: what follows it is ignored, unread
                self._done = True
                self.clean = False
                out.append(SSE_DONE)
                break
            try:
                out.append(_new_tuple(SseData, (value.decode("utf-8"),)))
            except UnicodeDecodeError:
                return None
        self._started = True
        return out

    def _line_goes_on(self, data: bytes) -> None:
        """`data` continues the unfinished line and does not end it: appended, without copying or
        searching what came before."""
        tail = self._tail
        tail += data
        if len(tail) > self._max_line:
            self._failure = ProtocolError(
                f"SSE line over {self._max_line} bytes (still unterminated at {len(tail)} bytes)"
            )
            self._failure_raised = True
            raise self._failure

    def end(self) -> list[SseEvent]:
        """The stream hit EOF. Returns no events; sets `partial_event` if one was cut off."""
        if self._failure is not None:
            self._raise_failure()
        if self._ended or self._done:
            self._ended = True
            return []
        self._ended = True
        self.clean = False
        self.partial_event = bool(self._tail) or bool(self._data.lines)
        self._tail.clear()
        self._data.clear()
        return []

    def _raise_failure(self) -> None:
        failure = self._failure
        assert failure is not None
        if not self._failure_raised:
            self._failure_raised = True
            raise failure
        raise ProtocolError(f"SSE stream already failed: {failure}") from failure

    def _lines(self, data: bytes, end: int, out: list[SseEvent]) -> None:
        """The complete lines `data[:end]` (each ended by LF), run by run (see the module)."""
        event = self._data
        pos = 0
        while pos < end:
            if data[pos] == 10:  # a blank line: the event is whole
                pos += 1
                if event.lines:
                    self._dispatch(out)
                    if self._done:
                        return
                continue
            stop = data.find(b"\n", pos) + 1  # past this line
            # More lines follow this one: the run, at once if it may be.
            if stop < end and data[stop] != 10:
                stop = _run_end(data, pos, end)
                if event.block(data, pos, stop):
                    pos = stop
                    continue
            elif stop - pos <= self._max_line and data.startswith(b"data:", pos):  # one data line
                event.line(data[pos + 6 if data[pos + 5 : pos + 6] == b" " else pos + 5 : stop - 1])
                pos = stop
                continue
            self._each_line(data[pos : stop - 1].split(b"\n"), out, stop - pos > self._max_line)
            pos = stop

    def _each_line(self, lines: list[bytes], out: list[SseEvent], check_length: bool) -> None:
        # No line is blank; `check_length` is False when the run is shorter than a line may be.
        for line in lines:
            if check_length and len(line) > self._max_line:
                raise ProtocolError(f"SSE line of {len(line)} bytes, over {self._max_line} bytes")
            if line[:5] == b"data:":
                self._data.line(line[6:] if line[5:6] == b" " else line[5:])
            elif line[0] == 58:  # ":"
                out.append(SseComment(_text(line[1:], "comment")))
            else:
                self._field(line)

    def _dispatch(self, out: list[SseEvent]) -> None:
        raw = self._data.take()
        if raw == _DONE:
            out.append(SSE_DONE)
            self._done = True
            self._tail.clear()
            self._cr_pending = False
            return
        out.append(SseData(_text(raw, "data")))

    def _field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        text = _text(value, "field value")
        if name == b"error":
            raise _error_from_text(text)
        if name == b"data":  # a bare "data" line: an empty data line
            self._data.line(b"")
            return
        _text(name, "field name")
        # Ignored, as the spec says of unknown fields: event:, id: and retry: carry nothing we use.


def _run_end(data: bytes, pos: int, end: int) -> int:
    """Where the run of lines from `pos` (not a blank one) ends, past its last LF: before the next
    blank line, or at the last line end within `_SPAN` bytes (the end of a longer first line)."""
    limit = min(end, pos + _SPAN)
    blank = data.find(b"\n\n", pos, limit)
    if blank >= 0:
        return blank + 1
    cut = data.rfind(b"\n", pos, limit) + 1
    return cut if cut > pos else data.find(b"\n", limit, end) + 1


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        around = raw[max(0, exc.start - 8) : exc.end + 8]
        message = f"SSE {what} is not valid UTF-8 at byte {exc.start}: {around!r}"
        raise ProtocolError(message) from exc


def _error_from_text(text: str) -> HttpError:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        obj = None
    return stream_error(obj, text)


def parse_chunk(data: str) -> dict[str, Any]:
    """Decode one `data:` payload into a JSON object.

    Raises `ProtocolError` for invalid JSON or a value that is not an object, and `HttpError`
    (status from the error's `code`, else 500; body the payload unchanged) for the in-stream
    error form `{"error": {...}}`.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"SSE data is not valid JSON ({exc}): {data[:120]!r}") from exc
    if type(obj) is not dict:
        raise ProtocolError(f"SSE data is JSON but not an object: {data[:120]!r}")
    if "error" in obj:
        raise stream_error(obj, data)
    return obj
