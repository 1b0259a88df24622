"""Every way a request can fail: one exception class per variant of the brief's `InferError`.

Adapters translate `OSError`, timeouts and malformed bytes into these at the edge, so callers
catch `InferError` and nothing else.
"""

from __future__ import annotations

import reprlib
from itertools import islice

ERROR_BODY_BYTES = 4096
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
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in islice(x.items(), self.maxdict)]
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
    """Base of every failure the inference path reports."""


class Busy(InferError):
    """Our own queue for the slot is full."""

    def __init__(self, slot: int, queued: int) -> None:
        super().__init__(f"slot {slot} is busy: {queued} requests already queued")
        self.slot = slot
        self.queued = queued


class ConnectError(InferError):
    """The socket could not be reached (missing, refused, permission denied)."""


class WaitTimeout(InferError):
    """The slot stayed busy past `busy_wait_ms`."""


class LoadTimeout(InferError):
    """The server stayed unavailable (loading, restarting) or unresponsive (it took connections
    and answered nothing: paused or stuck) past `load_wait_ms`; the message says which, and how
    long each."""


class Stalled(InferError):
    """Silence past the liveness limit, or an idle slot that never answered."""


class StreamClosedEarly(InferError):
    """The connection ended before the final chunk."""


class ThinkingOverrun(InferError):
    """Reasoning went on past the cap and its overrun, or the control call failed."""


class HttpError(InferError):
    """A non-200 answer. `body` is what was sent, decoded as UTF-8 (a byte that is not becomes
    U+FFFD), up to `limit` bytes of it (4 KiB by default), cut before a character the limit
    would split (the caller may parse it)."""

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
    """The error for a non-200 answer: `ModelNotLoaded` for a router's refusal to load, else `HttpError`."""
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
    status = code if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599 else 500
    return HttpError(status, body, 4 * len(body))  # every byte of its UTF-8


class Cancelled(InferError):
    """The caller cancelled the call (`CancelToken.cancel()`); its connections were closed, so
    the server stopped generating, and its place at the slot gate was given up."""


class ClientClosed(Cancelled):
    """The client was closed: a call in flight or queued was ended, or a new one refused
    without touching the server."""


class ProtocolError(InferError):
    """The bytes on the wire broke HTTP, SSE, JSON or a size cap; the message names what."""


class RequestError(InferError, ValueError):
    """A request that must not be sent (a slot id out of range, `tool_choice` "required" with no
    tool, text that is not valid Unicode, ...); nothing was sent. The message names what is wrong
    and where. Also a `ValueError`, since it is the caller's input that is wrong."""


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
