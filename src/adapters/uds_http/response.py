"""One request's response, sans-IO: bytes in, the head and then the body's pieces out.

The parsing core of the one exchange (`adapters.uds_http._async.exchange` and its generated
blocking twin), which owns the waits and the socket and nothing else, as h11 asks of its
callers. h11 parses and validates the response's status line and headers, the head's size cap
with it; a stream head h11 already read from an answer's first bytes is known by those bytes
(`KNOWN_HEAD`: llama-server's are all alike), and the next answer that begins with them gets it
as h11 read it. A request is rendered by h11 unless h11 would send it as it is: then its bytes,
exactly h11's, are written here (`_plain`), which a first token shows (see `render`).
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
- The head counts against `header_bytes` with every informational (1xx) head before it; the
  body's bytes that came with it do not.
- Nothing here reads a clock or a socket.
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
# The stand-in request of each method an h11 connection is given to read a response by.
_STAND_IN_HEADERS = [("Host", "localhost"), ("Connection", "close")]
_STAND_INS: dict[str, h11.Request] = {}
# The last stream head h11 read whole from an answer's first bytes, with those bytes: llama-server
# sends the same head, byte for byte, with every stream (it carries no date), and h11 reading it
# again costs a short answer about 8 % more CPU per chunk (`make bench`: "every head read by
# h11"). A list of one pair at most, swapped whole.
KNOWN_HEAD: list[tuple[bytes, ResponseHead]] = []


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
        # No secret in an error: a query string is shown without its values.
        self.what = method + " " + (shown_target(path) if "?" in path else path)

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Every header sent, in order: `Host`, the extra ones, a body's type and length,
        `Connection`."""
        return _fields(self.extra, self.body)

    def connection(self) -> h11.Connection:
        """An h11 client connection that has sent a request of this method, ready to read the
        response. h11 reads a response in the light of the request's method alone (a `HEAD`
        answer has no body), so a request rendered without h11 is stood for by one of its
        method, made once: the connection costs a fifth of rendering the request anew."""
        if self.conn is not None:
            return self.conn
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=self.header_bytes)
        stand_in = _STAND_INS.get(self.method)
        if stand_in is None:
            stand_in = h11.Request(method=self.method, target="/", headers=_STAND_IN_HEADERS)
            if len(_STAND_INS) < _PLAIN_NAMES:
                _STAND_INS[self.method] = stand_in
        conn.send(stand_in)  # (its end is not sent: h11 reads the answer all the same)
        return conn


def render(
    method: str,
    path: str,
    body: bytes | None,
    header_bytes: int,
    extra: tuple[tuple[str, str], ...] = (),
) -> Request:
    """The request's bytes (`Host`, the `extra` headers, a JSON body's type and length,
    `Connection: close`), exactly as h11 renders them. A malformed method, path or header is
    the caller's bug: `ValueError`, in h11's words. What h11 would send as it is (`_plain`) is
    written here: h11's own rendering costs a first token about 0.1 ms."""
    if not _plain(method, path, extra):
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=header_bytes)
        data = _send_with_h11(conn, method, path, _fields(extra, body), body)
        return Request(method, path, data, header_bytes, extra, body, conn)
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
    for name, value in extra:
        head += f"{name}: {value}\r\n"
    if body is None:
        data = (head + "Connection: close\r\n\r\n").encode("ascii")
        return Request(method, path, data, header_bytes, extra, body)
    head += "Content-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return Request(method, path, head.encode("ascii") + body, header_bytes, extra, body)


def _plain(method: str, path: str, extra: tuple[tuple[str, str], ...]) -> bool:
    """Whether h11 would send these as they are, with nothing to refuse or rewrite (h11's own
    grammar, `h11._abnf`). A method and target alike to the last ones that passed, and a header
    name that passed before, are not checked again (a chat's are always the same)."""
    global _last_target
    if (method, path) != _last_target:
        if not (method.isascii() and path.isascii()):
            return False
        if not (_TOKEN.fullmatch(method) and _TARGET.fullmatch(path)):
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
    conn: h11.Connection,
    method: str,
    path: str,
    headers: tuple[tuple[str, str], ...],
    body: bytes | None,
) -> bytes:
    try:
        out = conn.send(h11.Request(method=method, target=path, headers=list(headers)))
        if body:
            out += conn.send(h11.Data(data=body))
        out += conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:
        raise ValueError(f"cannot send {method!r} {path!r}: {exc}") from exc
    return bytes(out)


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
            owner_kind, link_kind = type(owner).__name__, type(link).__name__
            raise TypeError(f"{owner_kind} sends on its own connections, not on a {link_kind}")
    except BaseException:
        if link is not None:
            link.close()
        raise
    return request, link if isinstance(link, kind) else None


class ResponseParser:
    """The response to `request` (see the module for the driving protocol)."""

    __slots__ = (
        "_conn",
        "_done",
        "_fed",
        "_first",
        "_header_bytes",
        "_method",
        "_request",
        "body",
        "eof",
        "head",
        "what",
    )

    def __init__(self, request: Request) -> None:
        # h11's connection is made at the first bytes, not before the request is written: the
        # time it takes then runs while the answer is on its way.
        self._request = request
        self._conn: h11.Connection | None = None
        self._done = False  # h11 has read the head, or refused it
        self._method = request.method.upper()
        self._header_bytes = request.header_bytes
        self._fed = 0  # bytes received while reading the head
        self._first: bytes | None = None  # the first bytes, while the head may lie within them
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
        if self._conn is None and not self._fed and data:
            if KNOWN_HEAD and self._known(data):
                return
            self._first = data
        conn = self._conn if self._conn is not None else self._connection()
        self._fed += len(data)
        conn.receive_data(data)

    def _known(self, data: bytes) -> bool:
        """Whether `data` begins with the known head's bytes: then that head (h11 read those
        very bytes), and the rest of `data` is its body's."""
        raw, head = KNOWN_HEAD[0]
        if len(raw) > self._header_bytes or not data.startswith(raw):
            return False
        self._fed, self._done, self.head = len(data), True, head
        self.body = self._body_reader(head, data[len(raw) :])
        return True

    def next_head(self) -> ResponseHead | None:
        """The status and headers once they are complete; None while more bytes are needed."""
        if self.head is not None:
            return self.head
        if self._conn is None and not self._fed and not self.eof:
            return None  # nothing came yet (h11 is made at the first bytes, which may be known)
        conn = self._conn if self._conn is not None else self._connection()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._head_error(exc) from exc
            if event is _NEED_DATA:
                return None
            if type(event) is h11.Response:
                return self._take_head(conn, event)
            if type(event) is not h11.InformationalResponse:  # pragma: no cover - h11 guarantees
                kind = type(event).__name__
                raise ProtocolError(f"{self.what}: unexpected {kind} before the head")
            self._first = None  # the head does not begin the answer
            read = self._fed - len(conn.trailing_data[0])  # the 1xx heads count against the cap
            if read > self._header_bytes:
                self._conn, self._done = None, True
                raise ProtocolError(
                    f"{self.what}: {read} bytes of informational (1xx) responses and no response"
                    f" head: over the {self._header_bytes}-byte limit"
                )

    def _connection(self) -> h11.Connection:
        if self._done:  # the head was refused (too big, ambiguous framing): keep refusing it
            raise ProtocolError(f"{self.what}: response head already refused")
        self._conn = conn = self._request.connection()
        return conn

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

    def _take_head(self, conn: h11.Connection, event: h11.Response) -> ResponseHead:
        self._conn, self._done = None, True  # h11 is done either way: a body reader reads on
        unread, closed = conn.trailing_data
        size = self._fed - len(unread)
        if size > self._header_bytes:  # h11 caps only a head still incomplete
            over = f"over the {self._header_bytes}-byte limit"
            raise ProtocolError(f"{self.what}: response head of {size} bytes is {over}")
        if event.http_version not in (b"1.1", b"1.0"):
            version = event.http_version.decode()
            raise ProtocolError(f"{self.what}: unsupported HTTP version {version!r}")
        fields = event.headers.raw_items()  # (a list: the headers' own walk is a call a field)
        headers = tuple((n.lower().decode("ascii"), v.decode("latin-1")) for n, v in fields)
        head = ResponseHead(event.status_code, headers)
        self.body = self._body_reader(head, unread)
        self.head = head
        first, self._first = self._first, None  # not kept for the body's life
        if first is not None and size <= len(first) and type(self.body) is ChunkedBody:
            KNOWN_HEAD[:] = [(first[:size], head)]  # a stream's, and all in the first bytes
        if closed:  # pragma: no cover - EOF is handed to h11 only when it needs more for the head
            self.body.eof()
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
                both = "both Transfer-Encoding and Content-Length"
                raise ProtocolError(f"{self.what}: response has {both}")
            return ChunkedBody(self.what, self._header_bytes, buffered)
        if length is not None:
            return LengthBody(self.what, int(length), buffered)
        return BodyReader(self.what, buffered)

    def _head_error(self, exc: h11.RemoteProtocolError) -> Exception:
        what = self.what
        if self.eof:
            if self._fed == 0:
                where = f"before any response byte: {_DOWN}"
            else:
                where = f"inside the response head after {self._fed} bytes"
            return StreamClosedEarly(f"{what}: connection closed {where}")
        if str(exc) == "Receive buffer too long":
            return ProtocolError(f"{what}: response head over the {self._header_bytes}-byte limit")
        return ProtocolError(f"{what}: malformed response head: {exc}")


_DOWN = (
    "the server behind the socket is down or restarting, or a proxy refused the connection"
    " (inferproxy closes what it cannot forward, and a connection over its limits: its log says"
    " which)"
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
        f"{request.what}: connection to {peer} closed while the request was written"
        f" ({reason(exc)}), before any response byte: {_REFUSED};"
        f" worth another try after {after_ms:.0f} ms",
        retry_after_s,
    )


def reason(exc: BaseException) -> str:
    """An `OSError` in a few words: `ECONNRESET: Connection reset by peer`."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
    return str(exc) or type(exc).__name__
