"""The chat-completions body, rendered from typed inputs and plain settings.

Invariants:
- The bytes are a pure function of `(req, settings)`: fixed key order, compact separators,
  UTF-8, no ASCII escaping. A retry sends the same bytes again, and a later request that only
  appends messages renders the earlier messages to the same JSON text.
- Everything the server would accept but misread is refused here, before anything is sent, with
  a `RequestError` naming the problem: the server wraps an out-of-range `id_slot` modulo its slot
  count and treats an unknown `tool_choice` as "auto", silently.
- Caller data (message text, tool schemas, tool-call arguments) is passed through unchanged:
  `parameters` keeps the caller's key order, `arguments` stays the raw JSON text.

Pinned where the brief is silent: `tools` and `tool_choice` are sent only when there is at least
one tool (the template renders no tool section either way, and `tool_choice: "required"` with no
tool is refused as a caller error); sampling fields set to `None` are left out, so the server's
default applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from domain.errors import RequestError
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

CONTROL_ACTION = "reasoning_end"


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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: object, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise RequestError(f"{where} must be a string, not {type(value).__name__}")
    return value


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
    where = f"messages[{index}]"
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": _text(message.content, f"{where}.content")}
    if isinstance(message, UserMessage):
        return {"role": "user", "content": _text(message.content, f"{where}.content")}
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
            "parameters": tool.parameters,
        },
    }


def _check_slot(slot: object, total_slots: int | None) -> int:
    if not isinstance(slot, int) or isinstance(slot, bool):
        raise RequestError(f"slot must be an integer, not {type(slot).__name__}")
    if slot < 0:
        raise RequestError(f"slot {slot} is negative")
    if total_slots is not None and slot >= total_slots:
        last = f"0..{total_slots - 1}" if total_slots > 0 else "none"
        raise RequestError(f"slot {slot} is outside the server's {total_slots} slots ({last})")
    return slot


def _encode(body: dict[str, Any], what: str) -> bytes:
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{what} holds text that is not valid Unicode ({exc.reason})") from exc
    except (TypeError, ValueError) as exc:
        raise RequestError(f"{what} cannot be rendered as JSON: {exc}") from exc
    except RecursionError as exc:
        raise RequestError(f"{what} is nested too deeply to render as JSON") from exc


def build_chat_body(req: ChatRequest, settings: RequestSettings, *, total_slots: int | None) -> bytes:
    """The `POST /v1/chat/completions` body for `req`; `RequestError` if it must not be sent.

    `total_slots` is the server's slot count (from config or `/props`); `None` skips the upper
    bound check only.
    """
    slot = _check_slot(req.slot, total_slots)
    if not req.messages:
        raise RequestError("a request needs at least one message")
    if req.tool_choice not in TOOL_CHOICES:
        raise RequestError(f"tool_choice {req.tool_choice!r} is not one of {', '.join(TOOL_CHOICES)}")
    if not isinstance(req.thinking, bool):
        raise RequestError(f"thinking must be a bool, not {type(req.thinking).__name__}")
    if not _is_int(settings.max_tokens) or settings.max_tokens <= 0:
        raise RequestError(f"max_tokens must be a positive integer, not {settings.max_tokens!r}")

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
    body["max_tokens"] = settings.max_tokens
    for name in ("temperature", "top_p", "top_k", "min_p", "seed"):
        value = getattr(settings, name)
        if value is not None:
            body[name] = value
    return _encode(body, "the request")


def build_control_body(completion_id: str, model: str | None) -> bytes:
    """The `POST /v1/chat/completions/control` body that ends reasoning for `completion_id`.

    `model` routes the call in router mode; a single-model server ignores it.
    """
    if not isinstance(completion_id, str) or not completion_id:
        raise RequestError("the control call needs the completion id of the running stream")
    body: dict[str, Any] = {"id": completion_id, "action": CONTROL_ACTION}
    if model is not None:
        body["model"] = model
    return _encode(body, "the control call")
