"""Every way a call can fail, as a tree of families (the README's error table is this tree):

    InferError                      catch this: nothing else leaves the client
    ├── NetworkError                the connection or the stream broke            retried
    │   ├── ConnectError            the socket could not be reached
    │   └── StreamClosedEarly       the stream ended before its final chunk
    │       └── ProxyRefused        refused by a proxy: after 1/rate s             retried
    ├── InferTimeout                a wait ran out
    │   ├── Stalled                 silence past the liveness limit                retried
    │   ├── LoadTimeout             unavailable or unresponsive past load_wait_ms  retried
    │   └── WaitTimeout             the slot busy past busy_wait_ms                not retried
    ├── AnswerError                 the server answered what we cannot use
    │   ├── HttpError               a non-200 answer                               503 only
    │   │   └── ModelNotLoaded      a router has not loaded the model              not retried
    │   ├── ProtocolError           bytes that break HTTP, SSE, JSON or a cap      not retried
    │   └── ThinkingOverrun         reasoning past the cap and its overrun         not retried
    ├── CallerError                 refused here, before anything was sent
    │   ├── RequestError            a request that must not be sent (a ValueError)
    │   └── Busy                    our own queue for the slot is full
    └── Cancelled                   the caller cancelled the call                  not retried
        └── ClientClosed            the client was closed

`error.retried` says whether `chat_with_retry` tries again after it (`domain.retry` asks only
that, and waits `error.retry_after_s` when the error names a wait, its schedule's delay else);
each class's docstring says what happened and what the caller should do. Adapters
translate `OSError`, timeouts and malformed bytes into these at the edge.
"""

from __future__ import annotations

import reprlib
from itertools import islice

ERROR_BODY_BYTES = 4096
RETRIED_STATUS = frozenset({503})  # loading: the one answer worth asking again
SHOWN_CHARS = 120  # characters of an offending value quoted in an error


class _Shown(reprlib.Repr):
    """Three levels deep and six items a level: a value a thousand levels deep (JSON allows it)
    has no plain repr at all (`RecursionError`), and a long one none worth reading. A dict keeps
    its keys in the order they came (`reprlib` sorts them); text is cut at its end."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 6
        self.maxstring = self.maxother = self.maxlong = SHOWN_CHARS

    def repr_str(self, x: str, level: int) -> str:
        return repr(x[: self.maxstring])  # cut at its end, by `shown`, not in its middle

    def repr_bytes(self, x: bytes, level: int) -> str:
        return repr(x[: self.maxstring])

    def repr_dict(self, x: dict[object, object], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [
            f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
            for k, v in islice(x.items(), self.maxdict)
        ]
        return "{" + ", ".join(items) + (", ...}" if len(x) > self.maxdict else "}")


_SHOWN = _Shown()


def shown(value: object) -> str:
    """A value quoted in an error message (most often the server's): its repr, at most
    `SHOWN_CHARS` characters, never nested past three levels, whatever the value."""
    try:
        text = _SHOWN.repr(value)
    except ValueError:  # an int past Python's 4300 digits has no repr
        text = f"<{type(value).__name__} with no repr>"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


class InferError(Exception):
    """Base of every failure the inference path reports. `retried`: whether `chat_with_retry`
    makes another attempt after it (within the retry schedule and its total)."""

    retried: bool = False
    retry_after_s: float | None = None  # a wait the failure itself asks for before the next attempt


# -- the connection or the stream broke ------------------------------------------------------


class NetworkError(InferError):
    """The connection to the socket, or the stream on it, broke. Retried: the server or the
    proxy may be restarting. Past the retries: check that inferproxy and llama-server run."""

    retried = True


class ConnectError(NetworkError):
    """The socket could not be reached (missing, refused, permission denied); nothing was sent.
    The message names the socket path and what is wrong with it."""


class StreamClosedEarly(NetworkError):
    """The connection ended before the final chunk. A cut after the response head is re-attached
    first (the events go on where they broke); the message says when a router unloaded the model."""


class ProxyRefused(StreamClosedEarly):
    """The connection was closed right after the connect was accepted, before any response
    byte, with the request not yet written whole or just written: what inferproxy does to a
    connection over its accept or connection limit (another process sharing the proxy spent
    them), and what it does too when the server behind it is down (the bytes are the same).
    Retried after `retry_after_s`, the proxy's refill time (1/rate s), not on the schedule's
    delays; the attempts and the retry budget count it as any other."""

    def __init__(self, message: str, retry_after_s: float = 0.5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# -- a wait ran out ---------------------------------------------------------------------------


class InferTimeout(InferError):
    """A wait ran out; the message says which wait, how long it ran and what the server did."""


class WaitTimeout(InferTimeout):
    """The slot stayed busy (with someone else's request, on the server or queued here) past
    `busy_wait_ms`. Not retried: it has waited already. Try later, or another slot."""


class LoadTimeout(InferTimeout):
    """The server stayed unavailable (loading, restarting) or unresponsive (it took connections
    and answered nothing: paused or stuck) past `load_wait_ms`; the message says which, and how
    long each. Retried."""

    retried = True


class Stalled(InferTimeout):
    """Silence past the liveness limit, or an idle slot that never answered. Retried (a stream
    that had begun is re-attached)."""

    retried = True


# -- the server answered what we cannot use ---------------------------------------------------


class AnswerError(InferError):
    """The server answered, and the answer cannot be used; the same request would most likely
    get the same answer."""


class ThinkingOverrun(AnswerError):
    """Reasoning went on past the cap and its overrun, or the control call that ends it failed.
    Not retried. Lower `thinking_cap`, or ask without `thinking`."""


class HttpError(AnswerError):
    """A non-200 answer; retried only when it is a 503 (loading). A 400 "exceeds the available
    context size" means compact the prompt. `body` is what was sent, decoded as UTF-8 (a byte
    that is not becomes U+FFFD), up to `limit` bytes of it (4 KiB by default), cut before a
    character the limit would split (the caller may parse it)."""

    def __init__(self, status: int, body: str | bytes, limit: int = ERROR_BODY_BYTES) -> None:
        raw = body.encode("utf-8", "replace") if isinstance(body, str) else body
        cut = limit
        if len(raw) > limit:  # not inside a character: its continuation bytes (10xxxxxx) go too
            while cut > max(limit - 3, 0) and raw[cut] & 0xC0 == 0x80:
                cut -= 1
        text = raw[:cut].decode("utf-8", "replace")
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status = status
        self.body = text

    @property
    def retried(self) -> bool:  # type: ignore[override]
        return self.status in RETRIED_STATUS

    def kept(self, limit: int) -> HttpError:
        """The same error, its body kept to `limit` bytes."""
        return HttpError(self.status, self.body, limit)


class ModelNotLoaded(HttpError):
    """A llama-server router answered that the config's model is not loaded (HTTP 400 "model is
    not loaded"), to a call that does not load models: `props()`, `slots()`, `tokenize()`,
    `save_slot()` and `restore_slot()` never load one, so that they never evict another
    daemon's model under `--models-max`. A chat loads it (and waits for it under
    `load_wait_ms`); so does `props(load=True)`. Not retried."""


def http_error(status: int, body: bytes, limit: int) -> HttpError:
    """The error for a non-200 answer: `ModelNotLoaded` for a router's refusal to load, else
    `HttpError`."""
    if status == 400 and b"model is not loaded" in body:
        return ModelNotLoaded(status, body, limit)
    return HttpError(status, body, limit)


def stream_error(obj: object, body: str) -> HttpError:
    """The error a server sent inside a 200 stream: `{"error": {"code": N, ...}}`, or the older
    flat `{"code": N, ...}` of an `error:` field. The status is its code when that is an HTTP
    status, else 500; `body` is kept whole (as sent, within the SSE line cap), for the stream to
    keep what `error_body_bytes` says (`HttpError.kept`)."""
    code = None
    if isinstance(obj, dict):
        inner = obj.get("error")
        code = inner.get("code") if isinstance(inner, dict) else obj.get("code")
    status = (
        code if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599 else 500
    )
    return HttpError(status, body, 4 * len(body))  # every byte of its UTF-8


class Cancelled(InferError):
    """The caller cancelled the call (`CancelToken.cancel()`); its connections were closed, so
    the server stopped generating, and its place at the slot gate was given up. Not retried.

    `content` and `reasoning` are the text the call's `Content` and `Reasoning` events brought
    before it, since the call began or its last re-send (`Retrying(resend=True)` starts the
    answer over): the answer as far as it was shown. Empty when none came."""

    content: str = ""
    reasoning: str = ""

    def carrying(self, content: str, reasoning: str) -> Cancelled:
        """This error for a call whose events brought `content` and `reasoning`: a copy (its
        class, message, cause and traceback kept), as one error may end many calls (a close
        ends every call in flight with the same one)."""
        kind = type(self)
        copy = kind.__new__(kind)
        copy.args = self.args
        copy.__dict__.update(self.__dict__)
        copy.content, copy.reasoning = content, reasoning
        copy.__cause__, copy.__context__ = self.__cause__, self.__context__
        copy.__suppress_context__ = self.__suppress_context__
        return copy.with_traceback(self.__traceback__)


class ClientClosed(Cancelled):
    """The client was closed: a call in flight or queued was ended, or a new one refused
    without touching the server."""


class ProtocolError(AnswerError):
    """The bytes on the wire broke HTTP, SSE, JSON or a size cap; the message names what. Not
    retried: a server (or something between) that sends them is misconfigured or hostile."""


# -- refused here, before anything was sent ----------------------------------------------------


class CallerError(InferError):
    """The call was refused before anything was sent; the message names why."""


class RequestError(CallerError, ValueError):
    """A request that must not be sent (a slot id out of range, `tool_choice` "required" with no
    tool, text that is not valid Unicode, ...); nothing was sent. The message names what is wrong
    and where. Also a `ValueError`, since it is the caller's input that is wrong. Fix the
    request: sending it again would be refused again."""


class Busy(CallerError):
    """Our own queue for the slot is full (`queue_per_slot` callers wait already). Not retried:
    spread the calls over slots, or wait for one to end."""

    def __init__(self, slot: int, queued: int) -> None:
        super().__init__(f"slot {slot} is busy: {queued} requests already queued")
        self.slot = slot
        self.queued = queued


# Errors whose messages are all the client's own words (times, sizes, paths, counts): a log line
# may quote them. Every other message may carry the server's text or the caller's.
_OWN_WORDS = (Busy, ConnectError, WaitTimeout, LoadTimeout, Stalled, StreamClosedEarly, Cancelled)


def loggable(error: InferError) -> str:
    """`error` as a log line may carry it: never a byte of the server's text (an error body or a
    quoted answer may echo the prompt or the answer) nor of the caller's. An `HttpError` is its
    status; a `ProtocolError`, `ThinkingOverrun` or `RequestError` only its type; the others
    their own words. The exception itself keeps everything for the caller."""
    if isinstance(error, HttpError):
        return f"HttpError (HTTP {error.status})"
    if isinstance(error, _OWN_WORDS):
        return f"{type(error).__name__}: {error}"
    return type(error).__name__
