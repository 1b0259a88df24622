"""llama-server's HTTP API in one place: its paths, its query, the small request bodies, what a
chat answer's head must say, and the parsing of its JSON answers. Pure: bytes in, typed values
out; the adapters move the bytes, this module decides what they mean.

Invariants:
- Every JSON answer goes through one parser (`loads`, orjson) with one set of rules: valid UTF-8,
  no lone surrogates, no NaN or Infinity, nesting at most 1,024 deep. What breaks a rule is a
  `ProtocolError`, never `RecursionError`, `UnicodeError` or `ValueError`.
- Types are exact: a bool is not an integer (`type(x) is int`), an integer too large for 64 bits
  arrives as a float and is refused, a count is never negative.
- Every error names the endpoint, the field's path (`/slots[2].is_processing`) and what was found
  there, cut to a readable length.
- The slot probe's reading (`slot_state`) is lenient by design: any answer it cannot read means
  the server cannot say, `UNAVAILABLE`; the caller-facing readers (`parse_*`) are strict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from domain.errors import SHOWN_CHARS, ProtocolError, RequestError, StreamClosedEarly, shown
from domain.hashing import sha256
from domain.request_options import INT32_MAX
from ports.slot_probe import SlotState
from ports.transport import ResponseHead

CHAT_PATH: Final = "/v1/chat/completions"
CONTROL_PATH: Final = "/v1/chat/completions/control"
SLOTS_PATH: Final = "/slots"
PROPS_PATH: Final = "/props"
# A router lists every model it knows here, each with its status (`loaded`, `loading`,
# `unloaded`, `sleeping`); it never loads one to answer. A single-model server lists its one.
MODELS_PATH: Final = "/models"
# On a router, a request with this in its query is answered at once for a model that is not
# loaded (400 "model is not loaded"), never by loading it (and so evicting another under
# `--models-max`). A single-model server ignores it.
NO_AUTOLOAD: Final = "autoload=false"
TOKENIZE_PATH: Final = "/tokenize"
APPLY_TEMPLATE_PATH: Final = "/apply-template"
# A server started without `--slot-save-path` answers a slot save or restore with this.
SLOT_ACTIONS_UNSUPPORTED: Final = 501
STREAM_PATH: Final = "/v1/stream"
# With this request header on a chat POST the server keeps the response body in a replay ring
# (4 MiB, kept 300 s after the end) and goes on generating when the connection drops:
# `GET /v1/stream?conv_id=ID&from=N` re-attaches from byte N of the de-chunked body, and only
# `DELETE /v1/stream?conv_id=ID` stops the generation.
CONVERSATION_HEADER: Final = "X-Conversation-Id"
# Answers to a re-attach that mean the body cannot be had from there: the server restarted or
# forgot the id, or has no replay at all (404); the offset fell out of the ring (400).
REATTACH_REFUSED: Final = frozenset({400, 404})
# "Not now": the server is loading (or restarting); a later re-attach may get the stream, or 404.
REATTACH_LATER: Final = frozenset({503})

_UNRESERVED: Final = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
)


def with_model(path: str, model: str, *, autoload: bool = True) -> str:
    """`path?model=<model>`, every byte of the model's UTF-8 outside RFC 3986's unreserved set
    percent-encoded: a llama-server router routes a GET by it (a single-model server ignores it;
    a POST names the model in its body instead). Without `autoload`, a router answers for a
    model that is not loaded at once (`ModelNotLoaded`) instead of loading it."""
    return f"{path}?model={_query(model)}" + ("" if autoload else f"&{NO_AUTOLOAD}")


def no_autoload(path: str) -> str:
    """`path` (a POST's, which names the model in its body) that a router loads no model for."""
    return f"{path}{'&' if '?' in path else '?'}{NO_AUTOLOAD}"


def _query(value: str) -> str:
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in value.encode("utf-8"))


def reattach_later(status: int) -> StreamClosedEarly | None:
    """The break a re-attach answered `status` is, when a later one may still pick the stream up."""
    if status not in REATTACH_LATER:
        return None
    return StreamClosedEarly(
        f"GET {STREAM_PATH}: the server answered {status} (loading or restarting):"
        " not picked up yet"
    )


def reattach_path(conversation_id: str, offset: int) -> str:
    """`GET` this to re-attach to the body of conversation `conversation_id` from byte `offset`."""
    return f"{STREAM_PATH}?conv_id={_query(conversation_id)}&from={offset}"


def slot_action_path(slot: int, action: str) -> str:
    """`POST` this (with `slot_action_body`) to save or restore slot `slot`'s KV cache."""
    return f"{SLOTS_PATH}/{slot}?action={action}"


def slot_action_body(filename: str, model: str) -> bytes:
    """The body of a slot save or restore: a router routes the POST by its `model` (without it:
    400 "model name is missing from the request"); a single-model server ignores it."""
    return orjson.dumps({"filename": filename, "model": model})


def stop_path(conversation_id: str) -> str:
    """`DELETE` this to stop the generation of conversation `conversation_id` (idempotent)."""
    return f"{STREAM_PATH}?conv_id={_query(conversation_id)}"


def shown_target(path: str) -> str:
    """`path` as errors and log lines name it: a conversation id, which lets anyone who has it
    read the replay, shown as `conv_id=...`."""
    base, sep, query = path.partition("?")
    if "conv_id=" not in query:
        return path
    parts = ("conv_id=..." if part.startswith("conv_id=") else part for part in query.split("&"))
    return base + sep + "&".join(parts)


@dataclass(frozen=True, slots=True)
class Props:
    """What `/props` says of the server; `n_ctx` is per slot."""

    chat_template: str
    chat_template_sha256: str
    total_slots: int
    n_ctx: int
    model_alias: str | None = None
    model_path: str | None = None


@dataclass(frozen=True, slots=True)
class SlotInfo:
    id: int
    is_processing: bool
    n_ctx: int | None = None


@dataclass(frozen=True, slots=True)
class Token:
    """One token of `/tokenize`. llama-server sends a piece that is not valid UTF-8 on its own
    (part of a multi-byte character) as a list of byte values: `data` holds the exact bytes, so
    `b"".join(t.data for t in tokens)` is the text's UTF-8; `piece` is `data` as text, with
    U+FFFD where a character is split between tokens."""

    id: int
    piece: str
    data: bytes


def loads(raw: bytes | str, where: str) -> Any:
    """Parse one JSON document; `ProtocolError` naming `where` if it breaks a rule."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"{where}: answer is not valid JSON ({exc})") from exc


def _object(value: object, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise ProtocolError(f"{path} is {shown(value)}, not an object")
    return value


def _list(value: object, path: str) -> list[Any]:
    if type(value) is not list:
        raise ProtocolError(f"{path} is {shown(value)}, not a list")
    return value


def _count(
    obj: dict[str, Any], key: str, path: str, *, positive: bool = False, most: int | None = None
) -> int:
    """`obj[key]`, a count; `most` bounds what llama-server keeps in an int32 (slots, contexts,
    token ids), so a larger one is not its number and would wrap when sent back."""
    value = obj.get(key)
    least = 1 if positive else 0
    if type(value) is not int or value < least or (most is not None and value > most):
        need = "a positive integer" if positive else "a non-negative integer"
        quoted = "missing" if key not in obj else shown(value)
        raise ProtocolError(
            f"{path}.{key} is {quoted}, not {need}{'' if most is None else f' up to {most}'}"
        )
    return value


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if type(value) is str else None


def parse_props(raw: bytes) -> Props:
    """`GET /props`: the template (hashed here), the slot count and the per-slot context."""
    where = PROPS_PATH
    data = _object(loads(raw, where), where)
    template = data.get("chat_template")
    if type(template) is not str:
        quoted = "missing" if "chat_template" not in data else shown(template)
        raise ProtocolError(f"{where}.chat_template is {quoted}, not a string")
    defaults = f"{where}.default_generation_settings"
    settings = _object(data.get("default_generation_settings"), defaults)
    return Props(
        chat_template=template,
        chat_template_sha256=sha256(template.encode("utf-8")).hex(),
        total_slots=_count(data, "total_slots", where, positive=True, most=INT32_MAX),
        n_ctx=_count(settings, "n_ctx", defaults, positive=True, most=INT32_MAX),
        model_alias=_opt_str(data, "model_alias"),
        model_path=_opt_str(data, "model_path"),
    )


def parse_slots(raw: bytes) -> list[SlotInfo]:
    """`GET /slots`: one entry per slot, each with an integer `id` and a boolean `is_processing`."""
    where = SLOTS_PATH
    out = []
    for i, item in enumerate(_list(loads(raw, where), where)):
        path = f"{where}[{i}]"
        entry = _object(item, path)
        slot_id = _count(entry, "id", path, most=INT32_MAX)
        busy = entry.get("is_processing")
        if type(busy) is not bool:
            raise ProtocolError(f"{path}.is_processing is {shown(busy)}, not a boolean")
        n_ctx = entry.get("n_ctx")
        out.append(SlotInfo(slot_id, busy, n_ctx if type(n_ctx) is int and n_ctx > 0 else None))
    return out


def parse_tokens(raw: bytes) -> list[Token]:
    """`POST /tokenize` with `with_pieces`: each token's id and piece (text, or a byte list)."""
    where = TOKENIZE_PATH
    data = _object(loads(raw, where), where)
    out = []
    for i, item in enumerate(_list(data.get("tokens"), f"{where}.tokens")):
        path = f"{where}.tokens[{i}]"
        tok = _object(item, path)
        token_id = _count(tok, "id", path, most=INT32_MAX)
        piece = tok.get("piece")
        if type(piece) is str:
            try:
                data_bytes = piece.encode("utf-8")
            except UnicodeEncodeError as exc:  # pragma: no cover - `loads` refuses lone surrogates
                raise ProtocolError(f"{path}.piece is not valid text") from exc
            out.append(Token(token_id, piece, data_bytes))
        elif type(piece) is list and all(type(b) is int and 0 <= b <= 255 for b in piece):
            data_bytes = bytes(piece)
            out.append(Token(token_id, data_bytes.decode("utf-8", "replace"), data_bytes))
        else:
            raise ProtocolError(
                f"{path}.piece is {shown(piece)}, neither text nor a list of byte values"
            )
    return out


def control_refusal(raw: bytes) -> str | None:
    """`POST /v1/chat/completions/control`: None if it answered `{"success": true}`, else what
    it answered instead (an answer that is not JSON is a refusal too, not a crash)."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return f"the server answered non-JSON {shown(raw[:SHOWN_CHARS])}"
    if type(answer) is dict and answer.get("success") is True:
        return None
    return f"the server answered {shown(answer)}"


def _slot_entry(raw: bytes, slot: int) -> dict[str, Any] | None:
    """Slot `slot`'s entry in a `/slots` answer, read leniently: None for anything unreadable."""
    try:
        slots: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    for entry in slots if type(slots) is list else ():
        if type(entry) is dict and type(entry.get("id")) is int and entry["id"] == slot:
            return entry
    return None


def slot_state(raw: bytes, slot: int) -> SlotState:
    """The probe's reading of a `/slots` answer: `BUSY`/`IDLE` from the slot's `is_processing`,
    `UNAVAILABLE` for anything it cannot read (the server cannot say, so the load budget runs)."""
    entry = _slot_entry(raw, slot)
    busy = None if entry is None else entry.get("is_processing")
    if busy is True:
        return SlotState.BUSY
    if busy is False:
        return SlotState.IDLE
    return SlotState.UNAVAILABLE


def not_a_stream(head: ResponseHead, what: str) -> ProtocolError | None:
    """A whole answer where a stream was asked for (by `what`, the chat's POST or a re-attach)
    would read as a stream without its final chunk and be retried; it is a server that ignored
    `stream: true`."""
    kind = head.header("content-type")
    if kind is not None and not kind.lower().startswith("text/event-stream"):
        return ProtocolError(f"{what}: 200 answer is {kind!r}, not an event stream")
    return None


def tokenize_body(text: object, model: str | None) -> bytes:
    """The body of `POST /tokenize` for `text`, with each token's piece."""
    if type(text) is not str:
        raise RequestError(f"tokenize takes text (a str), not {type(text).__name__}")
    try:
        return orjson.dumps({"content": text, "with_pieces": True, "model": model})
    except orjson.JSONEncodeError as exc:
        raise RequestError(f"the text to tokenize is not valid Unicode ({exc})") from exc


def token_ids_body(text: str, model: str | None) -> bytes:
    """The body of `POST /tokenize` for a prompt the server rendered: the ids alone."""
    return orjson.dumps({"content": text, "model": model})


def parse_rendered(raw: bytes) -> str:
    """`POST /apply-template`: the prompt text the server would tokenize for that chat body."""
    where = APPLY_TEMPLATE_PATH
    prompt = _object(loads(raw, where), where).get("prompt")
    if type(prompt) is not str:
        raise ProtocolError(f"{where}.prompt is {shown(prompt)}, not a string")
    return prompt


def parse_token_ids(raw: bytes) -> list[int]:
    """`POST /tokenize` without pieces: the token ids."""
    where = TOKENIZE_PATH
    tokens = _list(_object(loads(raw, where), where).get("tokens"), f"{where}.tokens")
    for i, token in enumerate(tokens):
        if type(token) is not int or not 0 <= token <= INT32_MAX:
            raise ProtocolError(f"{where}.tokens[{i}] is {shown(token)}, not a token id")
    return tokens


def slot_held(raw: bytes, slot: int) -> int | None:
    """How many tokens `/slots` says slot `slot` holds (`n_prompt_tokens`; absent: none, a slot
    that has run nothing since the server started); None when the answer cannot say."""
    entry = _slot_entry(raw, slot)
    if entry is None:
        return None
    held = entry.get("n_prompt_tokens", 0)
    return held if type(held) is int and held >= 0 else None


def parse_slot_action(raw: bytes, tokens: str, size: str, where: str) -> tuple[int, int]:
    """A slot save (`n_saved`, `n_written`) or restore (`n_restored`, `n_read`) answer: the
    tokens (an int32 count, as every token count of the server's) and the bytes (a file size)."""
    data = _object(loads(raw, where), where)
    return _count(data, tokens, where, most=INT32_MAX), _count(data, size, where)
