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

Per-request options (`ChatRequest.max_tokens`, `sampling`, `stop`, `response_format`, `prefill`)
are checked and placed by `domain.request_options`; unset, they change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from domain.errors import RequestError, shown
from domain.json_check import encode_json, json_tree
from domain.messages import (
    TOOL_CHOICES,
    AssistantMessage,
    ChatRequest,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)
from domain.request_options import (
    INT32_MAX,
    checked_prefill,
    checked_response_format,
    sampling_fields,
    stop_strings,
)
from domain.request_options import RequestSettings as RequestSettings  # its home: request_options
from domain.sessions import session_of

CONTROL_ACTION = "reasoning_end"


def _text(value: object, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise RequestError(f"{where} must be a string, not {type(value).__name__}")
    return value


def _content(value: object, index: int) -> str:  # `_text`, the where said only when it is wrong
    return value if type(value) is str else _text(value, f"messages[{index}].content")  # type: ignore[return-value]


def listed(value: Any, where: str, what: str) -> Sequence[Any]:
    """`value` if it is a sequence (a tuple or a list, most often), not a string; else
    `RequestError`."""
    if type(value) is tuple or type(value) is list:
        return value
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return value
    raise RequestError(f"{where} must be a tuple or list of {what}, not {type(value).__name__}")


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


def message_dict(message: object, index: int) -> dict[str, Any]:
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
            out["reasoning_content"] = _text(
                message.reasoning_content, f"{where}.reasoning_content"
            )
        calls = listed(message.tool_calls, f"{where}.tool_calls", "ToolCalls")
        if calls:
            out["tool_calls"] = [
                _tool_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)
            ]
        return out
    if isinstance(message, ToolMessage):
        return {
            "role": "tool",
            "tool_call_id": _text(message.tool_call_id, f"{where}.tool_call_id"),
            "content": _text(message.content, f"{where}.content"),
        }
    raise RequestError(f"{where} is a {type(message).__name__}, not one of the four message kinds")


def tool_dict(tool: object, index: int) -> dict[str, Any]:
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


def build_chat_body(
    req: ChatRequest, settings: RequestSettings, *, total_slots: int | None
) -> bytes:
    """The `POST /v1/chat/completions` body for `req`; `RequestError` if it must not be sent.

    `total_slots` is the server's slot count (from config or `/props`); `None` skips the upper
    bound check only.
    """
    if not isinstance(req, ChatRequest):
        raise RequestError(f"the request must be a ChatRequest, not {type(req).__name__}")
    if req.slot is None:  # a session's slot is known once its call places it
        session_of(req)  # RequestError: neither slot nor session, or a bad key
        raise RequestError("a body names its slot: a session's request has one once it is sent")
    slot = check_slot(req.slot, total_slots)
    messages = listed(req.messages, "messages", "messages")
    tools = listed(req.tools, "tools", "ToolSchemas")
    if not messages:
        raise RequestError("a request needs at least one message")
    if req.tool_choice not in TOOL_CHOICES:
        raise RequestError(
            f"tool_choice {req.tool_choice!r} is not one of {', '.join(TOOL_CHOICES)}"
        )
    if not isinstance(req.thinking, bool):
        raise RequestError(f"thinking must be a bool, not {type(req.thinking).__name__}")
    max_tokens = effective_max_tokens(req, settings)
    sampling = sampling_fields(req.sampling, settings)
    stop = stop_strings(req.stop)
    response_format = checked_response_format(req.response_format)
    if response_format is not None and tools and req.tool_choice == "required":
        raise RequestError(
            'response_format cannot be combined with tool_choice "required":'
            " the answer is held to it"
        )
    prefill = checked_prefill(req.prefill, thinking=req.thinking, last=messages[-1])

    rendered = [message_dict(m, i) for i, m in enumerate(messages)]
    if prefill is not None:
        rendered.append({"role": "assistant", "content": prefill})
    body: dict[str, Any] = {"model": settings.model, "messages": rendered}
    if tools:
        body["tools"] = [tool_dict(t, i) for i, t in enumerate(tools)]
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
    raise RequestError(f"{where} must be a positive integer up to {INT32_MAX}, not {shown(value)}")


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
