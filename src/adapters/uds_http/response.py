"""One request's response, sans-IO: bytes in, the head and then the body's pieces out.

The parsing core of the one exchange (`adapters.uds_http._async.exchange` and its generated
blocking twin), which owns the waits and the socket and nothing else, as h11 asks of its
callers. h11 parses and validates the status line and headers (the head's size cap with it);
`adapters.uds_http.body` de-frames the body. The wording of every error is here, so both
exchanges say the same thing for the same bytes.

The driving protocol:

    head = parser.next_head()            # None: it needs more bytes
    while head is None:
        parser.receive_data(recv())      # b"" for EOF
        head = parser.next_head()
    body = parser.body                   # then body.pull() / body.push(data) / body.eof()

Invariants:
- Bytes are handed over only when the parser asked for them (`next_head` returned None), so EOF
  reaches h11 only after it said `NEED_DATA`, and every error h11 raises after EOF means "the
  peer closed inside the head": `StreamClosedEarly`. Every other framing error is a
  `ProtocolError`; EOF inside a body is `StreamClosedEarly` saying where (the body reader's).
- A head that was refused (too big, ambiguous framing) stays refused.
- Nothing here reads a clock or a socket.
- The first byte of an answer is what a user waits for, so the plain case skips h11 both ways,
  with h11's own grammar and h11's answers. A request is rendered without h11 when its method,
  target and extra headers pass the checks h11 makes and no extra header is one h11 treats
  specially (`Host`, `Content-Length`, `Transfer-Encoding`): the bytes are then exactly h11's. A
  response head is read without h11 when it is complete within the cap, every line ends in CRLF,
  the status line and every header line match h11's grammar, the status is final (200 or more)
  and its framing headers are unambiguous (one `Content-Length` of digits, or one
  `Transfer-Encoding: chunked`): h11 would give that very head. Anything else, and every error,
  is h11's: the bytes so far are handed to an h11 connection (made only then), which reads them
  as it would have from the start, every split giving the same result. A head byte for byte
  alike to the last one read so (llama-server's heads all are) is that same head, not read again.
"""

from __future__ import annotations

import errno
import re
from typing import TypeVar

import h11

from adapters.uds_http.body import BodyReader, ChunkedBody, EmptyBody, LengthBody
from domain.errors import ProtocolError, ProxyRefused, Stalled, StreamClosedEarly
from domain.llama_api import shown_target
from ports.transport import Link, ResponseHead

L = TypeVar("L")

_NEED_DATA = h11.NEED_DATA
# h11's own grammar (`h11._abnf`): a method and a header name are tokens, a target is visible
# ASCII, a header value is field-content (no NUL, CR or LF, no whitespace at either end).
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_TARGET = re.compile(r"[\x21-\x7e]+")
_VALUE = re.compile(r"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?", re.ASCII)
_SPECIAL = frozenset({"host", "content-length", "transfer-encoding"})
# What passed `_plain` before: the last method and target, and header names (a few at most).
_last_target: tuple[str, str] | None = None
_plain_names: set[str] = set()
_PLAIN_NAMES = 32
_PLAIN_HEAD = re.compile(
    rb"HTTP/1\.[01] [2-9][0-9]{2}(?: (?:[ \t]|[^\x00\s])*)?"  # h11's status line, a final status
    rb"(?:\r\n[-!#$%&'*+.^_`|~0-9a-zA-Z]+:[ \t]*(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?[ \t]*)*"  # its header lines
)
_CONTENT_LENGTH_DIGITS = 20  # h11's cap on a Content-Length
_H11 = object()  # `_plain_head`: the head is h11's to read
# The last head read without h11: its bytes up to the blank line, and the head. llama-server
# sends every answer's head byte for byte alike, so a head equal to the last is not read again
# (the head is immutable; one tuple, replaced whole, so threads at most read a head anew).
_last_plain: tuple[bytes, ResponseHead] | None = None


class Request:
    """A request rendered, ready to send; `connection()` then gives the h11 connection that
    parses its response's head. `extra` is the headers given besides the request's own, which
    `headers` lists whole."""

    __slots__ = ("body", "conn", "data", "extra", "header_bytes", "method", "path", "what")

    def __init__(
        self,
        method: str,
        path: str,
        data: bytes,
        header_bytes: int,
        extra: tuple[tuple[str, str], ...],
        body: bytes | None,
        conn: h11.Connection | None = None,  # h11's, when it rendered the request itself
    ) -> None:
        self.method = method
        self.path = path
        self.data = data
        self.header_bytes = header_bytes
        self.extra = extra
        self.body = body
        self.conn = conn
        self.what = method + " " + (shown_target(path) if "?" in path else path)  # no secret in an error

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Every header sent, in order: `Host`, the extra ones, a body's type and length, `Connection`."""
        return _fields(self.extra, self.body)

    def connection(self) -> h11.Connection:
        """An h11 client connection that has sent this request, ready to read the response."""
        if self.conn is not None:
            return self.conn
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=self.header_bytes)
        _send_with_h11(conn, self.method, self.path, self.headers, self.body)
        return conn


def render(
    method: str, path: str, body: bytes | None, header_bytes: int, extra: tuple[tuple[str, str], ...] = ()
) -> Request:
    """The request's bytes (`Host`, the `extra` headers, a JSON body's type and length,
    `Connection: close`). A malformed method, path or header is the caller's bug: `ValueError`."""
    if not _plain(method, path, extra):
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=header_bytes)
        data = _send_with_h11(conn, method, path, _fields(extra, body), body)
        return Request(method, path, data, header_bytes, extra, body, conn)
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
    for name, value in extra:
        head += f"{name}: {value}\r\n"
    if body is None:
        return Request(method, path, (head + "Connection: close\r\n\r\n").encode("ascii"), header_bytes, extra, body)
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return Request(method, path, head.encode("ascii") + body, header_bytes, extra, body)


def _fields(extra: tuple[tuple[str, str], ...], body: bytes | None) -> tuple[tuple[str, str], ...]:
    headers = [("Host", "localhost"), *extra]
    if body is not None:
        headers.append(("Content-Type", "application/json"))
        headers.append(("Content-Length", str(len(body))))
    headers.append(("Connection", "close"))
    return tuple(headers)


def render_for(
    link: Link | None,
    kind: type[L],
    owner: object,
    method: str,
    path: str,
    body: bytes | None,
    header_bytes: int,
    extra: tuple[tuple[str, str], ...] = (),
) -> tuple[Request, L | None]:
    """What a transport's `open` sends, and where: the request rendered, and `link` (a
    connection its `connect` made, of its own `kind`), or None to connect now. `link` is closed
    on either failure: a malformed request (`ValueError`), or a connection of another kind,
    which `owner` cannot send on (`TypeError`)."""
    try:
        request = render(method, path, body, header_bytes, extra)
        if link is not None and not isinstance(link, kind):
            raise TypeError(f"{type(owner).__name__} sends on its own connections, not on a {type(link).__name__}")
    except BaseException:
        if link is not None:
            link.close()
        raise
    return request, link if isinstance(link, kind) else None


def _plain(method: str, path: str, extra: tuple[tuple[str, str], ...]) -> bool:
    """Whether h11 would send these as they are, with nothing to refuse or rewrite. A method
    and target alike to the last ones that passed, and a header name that passed before, are
    not checked again (a chat's are always the same)."""
    global _last_target
    if (method, path) != _last_target:
        if not (method.isascii() and path.isascii() and _TOKEN.fullmatch(method) and _TARGET.fullmatch(path)):
            return False
        _last_target = (method, path)
    for name, value in extra:
        # (letters and digits, as a conversation id, pass without the regular expression)
        if not (isinstance(name, str) and isinstance(value, str) and value.isascii()):
            return False
        if not value.isalnum() and not _VALUE.fullmatch(value):
            return False
        if name not in _plain_names:
            if not (name.isascii() and _TOKEN.fullmatch(name)) or name.lower() in _SPECIAL:
                return False
            if len(_plain_names) < _PLAIN_NAMES:
                _plain_names.add(name)
    return True


def _send_with_h11(
    conn: h11.Connection, method: str, path: str, headers: tuple[tuple[str, str], ...], body: bytes | None
) -> bytes:
    try:
        out = conn.send(h11.Request(method=method, target=path, headers=list(headers)))
        if body:
            out += conn.send(h11.Data(data=body))
        out += conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:
        raise ValueError(f"cannot send {method!r} {path!r}: {exc}") from exc
    return bytes(out)


class ResponseParser:
    """The response to `request` (see the module for the driving protocol)."""

    __slots__ = (
        "_buffer",
        "_conn",
        "_fed",
        "_header_bytes",
        "_method",
        "_request",
        "_searched",
        "body",
        "eof",
        "head",
        "what",
    )

    def __init__(self, request: Request, *, plain: bool = True) -> None:
        """`plain=False` has h11 read every head (the tests compare the two)."""
        self._request: Request | None = request if plain else None  # while the head may be read without h11
        self._buffer = bytearray()  # the head's bytes so far, while it is
        self._searched = 0  # where the search for the blank line goes on from
        self._conn: h11.Connection | None = None if plain else request.connection()
        self._method = request.method.upper()
        self._header_bytes = request.header_bytes
        self._fed = 0  # bytes received while reading the head
        self.what = request.what
        self.head: ResponseHead | None = None
        self.body: BodyReader | None = None  # once the head is parsed
        self.eof = False

    def receive_data(self, data: bytes) -> None:
        """Bytes received (`b""`: the peer closed). Only after `next_head` returned None, or,
        once the head is out, after the body reader's `pull` did (a hot loop may push to
        `body` itself)."""
        if not data:
            self.eof = True
        body = self.body
        if body is not None:
            if data:
                body.push(data)
            else:
                body.eof()
            return
        self._fed += len(data)
        if self._request is not None:
            self._buffer += data
            return
        conn = self._conn
        if conn is None:  # pragma: no cover - `next_head` refuses first
            raise ProtocolError(f"{self.what}: response head already refused")
        conn.receive_data(data)

    def next_head(self) -> ResponseHead | None:
        """The status and headers once they are complete; None while more bytes are needed."""
        if self.head is not None:
            return self.head
        if self._request is not None:
            plain = self._plain_head()
            if plain is not _H11:
                return plain  # type: ignore[return-value]
        conn = self._conn if self._request is None else self._to_h11()
        if conn is None:  # the head was refused (too big, ambiguous framing): keep refusing it
            raise ProtocolError(f"{self.what}: response head already refused")
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._head_error(exc) from exc
            if event is _NEED_DATA:
                return None
            if type(event) is h11.Response:
                return self._take_head(event)
            if type(event) is not h11.InformationalResponse:  # pragma: no cover - h11 guarantees
                raise ProtocolError(f"{self.what}: unexpected {type(event).__name__} before the head")
            read = self._fed - len(conn.trailing_data[0])  # the 1xx heads count against the cap
            if read > self._header_bytes:
                self._conn = None
                raise ProtocolError(
                    f"{self.what}: {read} bytes of informational (1xx) responses and no response head:"
                    f" over the {self._header_bytes}-byte limit"
                )

    def _to_h11(self) -> h11.Connection:
        """Hand the head's bytes so far (and the EOF, if it came) to h11, to read from now on."""
        assert self._request is not None
        conn = self._conn = self._request.connection()
        self._request = None
        if self._buffer:
            conn.receive_data(bytes(self._buffer))
        if self.eof:
            conn.receive_data(b"")
        self._buffer = bytearray()
        return conn

    def _plain_head(self) -> ResponseHead | object | None:
        """The head read without h11 (see the module), None while more bytes are needed, or
        `_H11` when the bytes are h11's to read."""
        buf = self._buffer
        if buf and buf[0] < 0x21:  # h11 refuses it at once
            return _H11
        end = _blank_line_end(buf, self._searched)
        if end < 0:
            # h11 refuses an unfinished head over the cap at once; at EOF, h11 says how it ended.
            if self.eof or len(buf) > self._header_bytes:
                return _H11
            self._searched = max(0, len(buf) - 2)
            return None
        # Where h11 ends the head too: the first blank line, here the CRLF kind only.
        if end > self._header_bytes or buf[end - 4 : end] != b"\r\n\r\n":
            return _H11
        block = bytes(buf[: end - 4])
        global _last_plain
        last = _last_plain
        if last is not None and last[0] == block:
            head = last[1]  # the very bytes of the last head read: the same head
        else:
            read = _read_plain(block)
            if read is None:
                return _H11
            head = read
            _last_plain = (block, head)
        self._request = None
        unread = bytes(buf[end:])
        self._buffer = bytearray()
        return self._head_of(block[5:8], head, unread, end)

    # -- the wording of failures ------------------------------------------------------------------

    def failure(self, exc: OSError) -> StreamClosedEarly:
        """A receive that failed (reset by the peer), said with where in the response it was."""
        if self.body is None and self._fed == 0:
            return StreamClosedEarly(
                f"{self.what}: connection failed before any response byte ({reason(exc)}): {_DOWN}"
            )
        return StreamClosedEarly(f"{self.what}: connection failed {self.where()} ({reason(exc)})")

    @property
    def untouched(self) -> bool:
        """Whether no response byte has come (an EOF may have)."""
        return self.body is None and self._fed == 0

    def refused(self, exc: OSError | None, retry_after_s: float) -> ProxyRefused:
        """A close (`exc`: a reset) before any response byte, just after the request was written."""
        how = "closed" if exc is None else "failed"
        how += " before any response byte" + ("" if exc is None else f" ({reason(exc)})")
        return ProxyRefused(
            f"{self.what}: connection {how}, right after the request was written:"
            f" {_REFUSED}; worth another try after {retry_after_s * 1000:.0f} ms",
            retry_after_s,
        )

    def closed(self) -> StreamClosedEarly:
        """What a call on an exchange its owner closed raises."""
        return StreamClosedEarly(f"{self.what}: exchange already closed")

    def at_eof(self) -> StreamClosedEarly:
        return StreamClosedEarly(f"{self.what}: connection already at EOF")

    def where(self) -> str:
        if self.body is None:
            return f"inside the response head after {self._fed} bytes"
        return self.body.where()

    # -- the head -------------------------------------------------------------------------------

    def _take_head(self, event: h11.Response) -> ResponseHead:
        conn = self._conn
        assert conn is not None
        self._conn = None  # h11 is done either way: the body is read by a body reader
        unread, closed = conn.trailing_data
        headers = tuple((name.decode("ascii"), value.decode("latin-1")) for name, value in event.headers)
        head = self._head_of(
            event.http_version, ResponseHead(event.status_code, headers), unread, self._fed - len(unread)
        )
        if closed:  # pragma: no cover - EOF is handed to h11 only when it needs more for the head
            assert self.body is not None
            self.body.eof()
        return head

    def _head_of(self, version: bytes, head: ResponseHead, unread: bytes, size: int) -> ResponseHead:
        if size > self._header_bytes:
            raise ProtocolError(
                f"{self.what}: response head of {size} bytes is over the {self._header_bytes}-byte limit"
            )
        if version not in (b"1.1", b"1.0"):
            raise ProtocolError(f"{self.what}: unsupported HTTP version {version.decode()!r}")
        self.body = self._body_reader(head, unread)
        self.head = head
        return head

    def _body_reader(self, head: ResponseHead, buffered: bytes) -> BodyReader:
        # RFC 9112 section 6.3, in order. h11 has already refused a transfer coding other than
        # `chunked` and conflicting Content-Length values.
        status = head.status
        if self._method == "HEAD" or status in (204, 304) or status < 200:
            return EmptyBody(self.what, buffered)
        coding = head.header("transfer-encoding")
        length = head.header("content-length")
        if coding is not None:
            if length is not None:
                # RFC 9112 lets Transfer-Encoding win, but the pair is the shape of a smuggling
                # or splitting attempt and no honest server sends it: refuse it.
                raise ProtocolError(f"{self.what}: response has both Transfer-Encoding and Content-Length")
            return ChunkedBody(self.what, self._header_bytes, buffered)
        if length is not None:
            return LengthBody(self.what, int(length), buffered)
        return BodyReader(self.what, buffered)

    def _head_error(self, exc: h11.RemoteProtocolError) -> Exception:
        if self.eof:
            if self._fed == 0:
                return StreamClosedEarly(f"{self.what}: connection closed before any response byte: {_DOWN}")
            return StreamClosedEarly(f"{self.what}: connection closed inside the response head after {self._fed} bytes")
        if str(exc) == "Receive buffer too long":
            return ProtocolError(f"{self.what}: response head over the {self._header_bytes}-byte limit")
        return ProtocolError(f"{self.what}: malformed response head: {exc}")


def _blank_line_end(buf: bytearray, start: int) -> int:
    """Where the first blank line from `start` ends (`\n\n` or `\n\r\n`, as h11 ends a head),
    or -1: two `find`s, so that no regular expression runs on the way to the first token (where,
    after an idle spell, every step costs several times its warm cost)."""
    bare, crlf = buf.find(b"\n\n", start), buf.find(b"\n\r\n", start)
    if bare < 0:
        return crlf + 3 if crlf >= 0 else -1
    return bare + 2 if crlf < 0 or bare < crlf else crlf + 3


def _read_plain(block: bytes) -> ResponseHead | None:
    """The head whose bytes up to its blank line are `block`, when h11 would read it so (see
    the module); None when it is h11's to read."""
    # One match holds the whole head to h11's grammar (a final status, HTTP/1.0 or 1.1, CRLF lines).
    if _PLAIN_HEAD.fullmatch(block) is None:
        return None
    headers: list[tuple[str, str]] = []
    framing = 0
    for line in block.split(b"\r\n")[1:]:
        raw_name, _, raw_value = line.partition(b":")
        name = raw_name.lower()
        value = raw_value.strip(b" \t")
        if name == b"content-length":
            framing += 1
            if not value.isdigit() or len(value) > _CONTENT_LENGTH_DIGITS:
                return None
        elif name == b"transfer-encoding":
            framing += 1
            value = value.lower()
            if value != b"chunked":
                return None
        headers.append((name.decode("ascii"), value.decode("latin-1")))
    if framing > 1:
        return None
    return ResponseHead(int(block[9:12]), tuple(headers))


_DOWN = (
    "the server behind the socket is down or restarting, or a proxy refused the connection"
    " (inferproxy closes what it cannot forward, and a connection over its limits: its log says which)"
)


_REFUSED = (
    "a proxy refused it (inferproxy closes a connection over its accept rate or its connection"
    " limit: another process shares it), or the server behind the socket is down or restarting"
)


def write_stalled(request: Request, peer: str, timeout: float) -> Stalled:
    return Stalled(f"{request.what}: writing the request to {peer} took over {timeout} s")


def write_failed(request: Request, peer: str, exc: OSError, retry_after_s: float) -> ProxyRefused:
    """A connection closed (or reset) before the request was written whole, nothing answered:
    nothing can have started, so it is a refusal (`ProxyRefused`)."""
    after_ms = retry_after_s * 1000
    return ProxyRefused(
        f"{request.what}: connection to {peer} closed while the request was written ({reason(exc)}),"
        f" before any response byte: {_REFUSED}; worth another try after {after_ms:.0f} ms",
        retry_after_s,
    )


def reason(exc: BaseException) -> str:
    """An `OSError` in a few words: `ECONNRESET: Connection reset by peer`."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
    return str(exc) or type(exc).__name__
