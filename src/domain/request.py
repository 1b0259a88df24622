"""The chat-completions body, rendered from typed inputs and plain settings.

Invariants:
- The bytes are a pure function of `(req, settings)`: fixed key order, compact separators,
  UTF-8, no ASCII escaping. A retry sends the same bytes again, and a later request that only
  appends messages renders the earlier messages to the same JSON text.
- Everything the server would accept but misread is refused here, before anything is sent, with
  a `RequestError` naming the problem: the server wraps an out-of-range `id_slot` modulo its slot
  count and treats an unknown `tool_choice` as "auto", silently.
- Caller data (message text, tool schemas, tool-call arguments) is passed through unchanged:
  `parameters` keeps the caller's key order, `arguments` stays the raw JSON text. Every JSON tree
  the caller hands in (each tool's `parameters`, `response_format`) is held to the one rule of
  `domain.json_check` (string keys, JSON types, valid text, finite numbers, bounded depth and
  size), so nothing is coerced on the way out: a bad tree is a `RequestError` naming its path.

Pinned where the brief is silent: `tools` and `tool_choice` are sent only when there is at least
one tool (the template renders no tool section either way, and `tool_choice: "required"` with no
tool is refused as a caller error); sampling fields set to `None` are left out, so the server's
default applies.

Per-request options (`ChatRequest.max_tokens`, `sampling`, `stop`, `response_format`):
- Unset, they change nothing: the body is byte for byte what it is without them. Set,
  `max_tokens` and each sampling field take the config's value's place (same key, same
  position); a sampling field the config leaves out goes where it would have been. `stop` and
  then `response_format` come last, and only when given.
- Each is held to the bounds the config's own values are held to (llama-server keeps token
  counts and `top_k` in an int32, `seed` in a uint32 with -1 for random, `temperature` in a C
  float). `stop` is at most `MAX_STOP` non-empty strings (llama-server sets no limit; more than a
  few is a mistake).
- `response_format` is checked only where llama-server would misread it silently: a `type` it
  does not know is an error there, but a missing or non-string `type`, a `json_schema` without a
  `schema` object, or a `schema` that is not an object all quietly become "any JSON" or "no
  constraint". Everything else is sent exactly as given, key order kept: the grammar follows the
  schema's property order.
- With tools, `response_format` wins: the answer is held to the schema and no tool can be called.
  `tool_choice: "required"` with a `response_format` asks for both and is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.errors import RequestError
from domain.json_check import MAX_JSON_DEPTH, encode_json, json_tree, valid_text
from domain.json_check import quote as _quote
from domain.messages import (
    TOOL_CHOICES,
    AssistantMessage,
    ChatRequest,
    Sampling,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)

CONTROL_ACTION = "reasoning_end"

# The bounds `app.config` holds the config's values to (the domain cannot import it): llama-server
# reads token counts and `top_k` into int32, `seed` into uint32 (-1 is its "random seed", any
# other negative number would wrap), `temperature` into a C float (past its range it arrives as inf).
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
RANDOM_SEED = -1
FLOAT32_MAX = 3.4028234663852886e38
SAMPLING_FIELDS: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p", "seed")
# llama-server takes any number of stop strings and checks each against the tail of the answer
# after every token; past this many, the list is a mistake, not a request.
MAX_STOP = 16
# The `type`s llama-server knows; "text" means no constraint.
RESPONSE_FORMAT_TYPES: tuple[str, ...] = ("json_schema", "json_object", "text")
# How deep a `response_format` may nest: the depth every caller JSON tree is held to.
MAX_FORMAT_DEPTH = MAX_JSON_DEPTH


@dataclass(frozen=True, slots=True)
class RequestSettings:
    """What every request carries besides its inputs. `None` leaves a sampling field out."""

    model: str
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    # Sent as `thinking_budget_tokens` with every thinking request: the server ends the thinking
    # block at exactly this many tokens. None sends nothing (the client's reasoning_end call alone).
    thinking_budget: int | None = None
    # The sampling fields set, in their fixed order: what a request without `sampling` sends.
    sampled: tuple[tuple[str, float | int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sampled = tuple((name, value) for name in SAMPLING_FIELDS if (value := getattr(self, name)) is not None)
        object.__setattr__(self, "sampled", sampled)


def _text(value: object, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise RequestError(f"{where} must be a string, not {type(value).__name__}")
    return value


def _content(value: object, index: int) -> str:  # `_text`, the where said only when it is wrong
    return value if type(value) is str else _text(value, f"messages[{index}].content")  # type: ignore[return-value]


def _tool_call(call: object, where: str) -> dict[str, Any]:
    if not isinstance(call, ToolCall):
        raise RequestError(f"{where} must be a ToolCall, not {type(call).__name__}")
    return {
        "id": _text(call.id, f"{where}.id"),
        "type": "function",
        "function": {
            "name": _text(call.name, f"{where}.name"),
            # Raw JSON text as the server sent it; a dict here would render differently.
            "arguments": _text(call.arguments, f"{where}.arguments"),
        },
    }


def _message(message: object, index: int) -> dict[str, Any]:
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": _content(message.content, index)}
    if isinstance(message, UserMessage):
        return {"role": "user", "content": _content(message.content, index)}
    where = f"messages[{index}]"
    if isinstance(message, AssistantMessage):
        out: dict[str, Any] = {
            "role": "assistant",
            "content": _text(message.content, f"{where}.content", optional=True),
        }
        if message.reasoning_content is not None:
            out["reasoning_content"] = _text(message.reasoning_content, f"{where}.reasoning_content")
        if message.tool_calls:
            out["tool_calls"] = [
                _tool_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(message.tool_calls)
            ]
        return out
    if isinstance(message, ToolMessage):
        return {
            "role": "tool",
            "tool_call_id": _text(message.tool_call_id, f"{where}.tool_call_id"),
            "content": _text(message.content, f"{where}.content"),
        }
    raise RequestError(f"{where} is a {type(message).__name__}, not one of the four message kinds")


def _tool(tool: object, index: int) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, ToolSchema):
        raise RequestError(f"{where} must be a ToolSchema, not {type(tool).__name__}")
    if not isinstance(tool.parameters, dict):
        raise RequestError(f"{where}.parameters must be a JSON Schema object (a dict)")
    return {
        "type": "function",
        "function": {
            "name": _text(tool.name, f"{where}.name"),
            "description": _text(tool.description, f"{where}.description"),
            "parameters": json_tree(tool.parameters, f"{where}.parameters"),
        },
    }


def check_slot(slot: object, total_slots: int | None) -> int:
    if not isinstance(slot, int) or isinstance(slot, bool):
        raise RequestError(f"slot must be an integer, not {type(slot).__name__}")
    if slot < 0:
        raise RequestError(f"slot {slot} is negative")
    if total_slots is not None and slot >= total_slots:
        last = f"0..{total_slots - 1}" if total_slots > 0 else "none"
        raise RequestError(f"slot {slot} is outside the server's {total_slots} slots ({last})")
    return slot


def _number(value: object, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{where} must be a number, not {type(value).__name__}")
    try:
        # A float, as the config's floats are: `1` and `1.0` render the same.
        number = float(value)
    except OverflowError:  # an int past the float range
        number = math.inf
    if not low <= number <= high:  # also refuses nan
        raise RequestError(f"{where} must be a finite number from {low:g} to {high:g}, not {_quote.repr(value)}")
    return number


def _integer(value: object, where: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(f"{where} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise RequestError(f"{where} must be from {low} to {high}, not {_quote.repr(value)}")
    return value


def _sampling_override(name: str, value: object) -> float | int:
    where = f"sampling.{name}"
    if name == "temperature":
        return _number(value, where, 0.0, FLOAT32_MAX)
    if name == "top_k":
        return _integer(value, where, 0, INT32_MAX)
    if name == "seed":
        return _integer(value, where, RANDOM_SEED, UINT32_MAX)
    return _number(value, where, 0.0, 1.0)  # top_p, min_p


def _sampling(override: object, settings: RequestSettings) -> dict[str, Any]:
    """The sampling fields in their fixed order: the request's value, else the config's."""
    if override is None:
        return dict(settings.sampled)
    if not isinstance(override, Sampling):
        raise RequestError(f"sampling must be a Sampling, not {type(override).__name__}")
    out: dict[str, Any] = {}
    for name in SAMPLING_FIELDS:
        mine = getattr(override, name)
        value = getattr(settings, name) if mine is None else _sampling_override(name, mine)
        if value is not None:
            out[name] = value
    return out


def _stop(stop: object) -> list[str]:
    if not isinstance(stop, tuple | list):
        raise RequestError(f"stop must be a tuple or list of strings, not {type(stop).__name__}")
    if len(stop) > MAX_STOP:
        raise RequestError(f"stop has {len(stop)} strings, more than {MAX_STOP}")
    out = []
    for index, text in enumerate(stop):
        where = f"stop[{index}]"
        if not isinstance(text, str) or not text:
            raise RequestError(f"{where} must be a non-empty string, not {_quote.repr(text)}")
        out.append(valid_text(text, where))
    return out


def _schema_object(container: Mapping[str, Any], where: str, *, required: bool) -> None:
    if "schema" not in container and not required:
        return
    if not isinstance(container.get("schema"), Mapping):
        found = type(container["schema"]).__name__ if "schema" in container else "nothing"
        raise RequestError(f"{where}.schema must be a JSON Schema object, not {found}")


def _response_format(value: object) -> dict[str, Any] | None:
    """The caller's `response_format`, checked where llama-server would misread it silently."""
    if value is None:
        return None
    where = "response_format"
    if not isinstance(value, Mapping):
        raise RequestError(f"{where} must be a mapping, not {type(value).__name__}")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in RESPONSE_FORMAT_TYPES:
        raise RequestError(f"{where}.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, not {_quote.repr(kind)}")
    if kind == "json_schema":
        wrapper = value.get("json_schema")
        if not isinstance(wrapper, Mapping):
            raise RequestError(f"{where}.json_schema must be a mapping, not {type(wrapper).__name__}")
        if "name" in wrapper and not isinstance(wrapper["name"], str):
            raise RequestError(f"{where}.json_schema.name must be a string, not {type(wrapper['name']).__name__}")
        _schema_object(wrapper, f"{where}.json_schema", required=True)
    elif kind == "json_object":
        _schema_object(value, where, required=False)
    tree: dict[str, Any] = json_tree(value, where)
    return tree


def build_chat_body(req: ChatRequest, settings: RequestSettings, *, total_slots: int | None) -> bytes:
    """The `POST /v1/chat/completions` body for `req`; `RequestError` if it must not be sent.

    `total_slots` is the server's slot count (from config or `/props`); `None` skips the upper
    bound check only.
    """
    slot = check_slot(req.slot, total_slots)
    if not req.messages:
        raise RequestError("a request needs at least one message")
    if req.tool_choice not in TOOL_CHOICES:
        raise RequestError(f"tool_choice {req.tool_choice!r} is not one of {', '.join(TOOL_CHOICES)}")
    if not isinstance(req.thinking, bool):
        raise RequestError(f"thinking must be a bool, not {type(req.thinking).__name__}")
    max_tokens = effective_max_tokens(req, settings)
    sampling = _sampling(req.sampling, settings)
    stop = _stop(req.stop)
    response_format = _response_format(req.response_format)
    if response_format is not None and req.tools and req.tool_choice == "required":
        raise RequestError('response_format cannot be combined with tool_choice "required": the answer is held to it')

    body: dict[str, Any] = {
        "model": settings.model,
        "messages": [_message(m, i) for i, m in enumerate(req.messages)],
    }
    if req.tools:
        body["tools"] = [_tool(t, i) for i, t in enumerate(req.tools)]
        body["tool_choice"] = req.tool_choice
    elif req.tool_choice == "required":
        raise RequestError('tool_choice "required" needs at least one tool')
    body["id_slot"] = slot
    body["cache_prompt"] = True
    body["stream"] = True
    body["return_progress"] = True
    body["timings_per_token"] = True
    body["reasoning_control"] = True
    body["chat_template_kwargs"] = {"enable_thinking": req.thinking}
    if req.thinking and settings.thinking_budget is not None:
        body["thinking_budget_tokens"] = settings.thinking_budget
    body["max_tokens"] = max_tokens
    body.update(sampling)
    if stop:
        body["stop"] = stop
    if response_format is not None:
        body["response_format"] = response_format
    return encode_json(body, "the request")


def effective_max_tokens(req: ChatRequest, settings: RequestSettings) -> int:
    """The `max_tokens` the body carries for `req`: its own if set, else the config's.

    The client bounds the stream's `predicted_n` by it; `RequestError` if either is out of range.
    """
    _tokens(settings.max_tokens, "max_tokens")
    if req.max_tokens is None:
        return settings.max_tokens
    return _tokens(req.max_tokens, "max_tokens")


def _tokens(value: object, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= INT32_MAX:
        return value
    raise RequestError(f"{where} must be a positive integer up to {INT32_MAX}, not {_quote.repr(value)}")


def build_control_body(completion_id: str, model: str | None) -> bytes:
    """The `POST /v1/chat/completions/control` body that ends reasoning for `completion_id`.

    `model` routes the call in router mode; a single-model server ignores it.
    """
    if not isinstance(completion_id, str) or not completion_id:
        raise RequestError("the control call needs the completion id of the running stream")
    body: dict[str, Any] = {"id": completion_id, "action": CONTROL_ACTION}
    if model is not None:
        body["model"] = model
    return encode_json(body, "the control call")
