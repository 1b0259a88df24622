"""The data of the SSE event being read, and its caps (see `domain.sse`, which feeds it lines).

Invariants:
- An event holds at most `limit` bytes of data values and at most `limit` data lines (an endless
  run of empty `data:` lines would otherwise grow without a byte of data); one more byte or line
  is a `ProtocolError` naming that cap. So its joined data (the values and the "\\n" between
  them) is at most `2 * limit - 1` bytes: the bound on what one event can make the client hold.
- Data is kept as the first line's value and one buffer of "\\n" and each later value: never an
  object per line, never a copy of what came before.
- A run of complete `data:` lines is taken at once (`block`) when every line of it is one and the
  event stays within its caps with them: a few passes of bytes methods over the run, nothing per
  line in Python, so an event of many short lines costs about what one long line does. Anything
  else, and a run in which a cap is passed, is taken line by line (`line`), so a cap fails at the
  line that passes it, as it would have however the bytes were split.
"""

from __future__ import annotations

from domain.errors import ProtocolError

# The most bytes a line has besides its value: `data:` and the one space that may follow it.
_PREFIX = 6


class EventData:
    """The data lines of one event so far: `lines` of them, `size` bytes of values."""

    __slots__ = ("_first", "_limit", "_more", "lines", "size")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._first = b""  # the first line's value (or the values of the first run, joined)
        self._more = bytearray()  # "\n" and the value of each later line
        self.lines = 0
        self.size = 0

    def line(self, value: bytes) -> None:
        """One more data line, whose value is `value`."""
        size = self.size + len(value)
        if size > self._limit:
            raise ProtocolError(f"SSE event data over {self._limit} bytes")
        if self.lines:
            if self.lines >= self._limit:
                raise ProtocolError(f"SSE event of more than {self._limit} data lines")
            more = self._more
            more += b"\n"
            more += value
        else:
            self._first = value
        self.lines += 1
        self.size = size

    def block(self, data: bytes, pos: int, stop: int) -> bool:
        """Take the complete lines `data[pos:stop]` (no blank one among them; `data[stop - 1]` is
        the last one's LF) at once, if each is a `data:` line and the caps hold with them all;
        False, nothing taken, otherwise."""
        if not data.startswith(b"data:", pos):
            return False
        last = stop - 1
        # The lines after the first (`find` first: far faster than `count` over one long line).
        more = data.count(b"\n", pos, last) if data.find(b"\n", pos, last) >= 0 else 0
        if more and data.count(b"\ndata:", pos, last) != more:
            return False
        value = data[pos + 6 if data[pos + 5 : pos + 6] == b" " else pos + 5 : last]
        if more:  # a value holds no LF, so an LF is always a line's start
            value = value.replace(b"\ndata:", b"\n").replace(b"\n ", b"\n")
        limit = self._limit
        lines = self.lines + more + 1
        size = self.size + len(value) - more
        # Each line is at most its prefix and its value, and no longer than the run.
        if lines > limit or size > limit or (last - pos > limit and size + _PREFIX > limit):
            return False
        if self.lines:
            buffer = self._more
            buffer += b"\n"
            buffer += value
        else:
            self._first = value
        self.lines = lines
        self.size = size
        return True

    def take(self) -> bytes:
        """The event's data, joined; the next event starts empty."""
        raw = self._first + self._more if self._more else self._first
        self.clear()
        return raw

    def clear(self) -> None:
        self._first = b""
        if self._more:
            self._more = bytearray()
        self.lines = 0
        self.size = 0
