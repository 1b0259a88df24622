"""Messages and tools to and from the OpenAI-style dicts a daemon may already hold (a history
kept as JSON, another client's request).

Invariants:
- `to_openai` writes each message as the request body renders it (`domain.request`): `role`,
  `content` (None for an assistant message without text), `reasoning_content` only when set,
  `tool_calls` only when there are any (`{"id", "type": "function", "function": {"name",
  "arguments"}}`), `tool_call_id` for a tool's result. `tools_to_openai` writes each tool as
  `{"type": "function", "function": {"name", "description", "parameters"}}`.
- Exact both ways: `from_openai(to_openai(m)) == m` for messages whose tool calls are tuples (as
  the `from_` side makes them), and `to_openai(from_openai(d)) == d` for every list `to_openai`
  writes; the same for tools. So nothing is read that cannot be written back: a key this library
  has no field for (a user's `name`, a tool's `strict`) is refused, not dropped, and so is a
  tool without a `description` or `parameters` (`ToolSchema` holds both).
- A malformed dict is a `ValueError` naming its index and key (`messages[3].role: unknown role
  'bot'`), never a `KeyError`; a message `to_openai` is handed that no request could send is the
  `RequestError` (a `ValueError`) `chat` would raise, in its words (`messages[2].content must be
  a string, not int`).
- What is written shares nothing with what it was read from: either side may change after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from domain import request
from domain.errors import RequestError, shown
from domain.json_check import json_tree
from domain.messages import (
    AssistantMessage,
    ChatMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)

__all__ = ["from_openai", "to_openai", "tools_from_openai", "tools_to_openai"]

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
# The keys each role's dict may hold, `role` among them.
_KEYS: dict[str, tuple[str, ...]] = {
    "system": ("role", "content"),
    "user": ("role", "content"),
    "assistant": ("role", "content", "reasoning_content", "tool_calls"),
    "tool": ("role", "tool_call_id", "content"),
}


# -- to the dicts -----------------------------------------------------------------------------


def to_openai(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """`messages` as OpenAI-style dicts, each as the request body renders it (by the very code)."""
    listed = request.listed(messages, "messages", "messages")
    return [request.message_dict(message, index) for index, message in enumerate(listed)]


def tools_to_openai(tools: Sequence[ToolSchema]) -> list[dict[str, Any]]:
    """`tools` as OpenAI-style dicts, each as the request body renders it (`parameters` a copy)."""
    listed = request.listed(tools, "tools", "ToolSchemas")
    return [request.tool_dict(tool, index) for index, tool in enumerate(listed)]


def _json_object(value: object, where: str, kind: type[Exception]) -> dict[str, Any]:
    """A copy of a JSON Schema object held to `domain.json_check`'s rule; `kind` if it breaks it."""
    if not isinstance(value, Mapping):
        raise kind(f"{where}: must be a JSON Schema object (a dict), not {type(value).__name__}")
    try:
        tree: dict[str, Any] = json_tree(value, where)
    except RequestError as exc:  # its words name the place; it is no request here
        raise ValueError(str(exc)) from None
    return tree


# -- from the dicts ---------------------------------------------------------------------------


def _dict(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: must be a dict, not {type(value).__name__}")
    return value


def _only(data: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in keys:
            name = f"{where}.{key}" if isinstance(key, str) else f"{where}[{shown(key)}]"
            raise ValueError(f"{name}: unknown key (this dict holds {', '.join(keys)})")


def _text(data: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    if key not in data:
        if optional:
            return None
        raise ValueError(f"{where}.{key}: required key is missing")
    value = data[key]
    if value is None and optional:
        return None
    if not isinstance(value, str):
        hint = (
            ": serialise it to JSON text first"
            if key == "arguments" and isinstance(value, Mapping)
            else ""
        )
        raise ValueError(f"{where}.{key}: must be a string, not {type(value).__name__}{hint}")
    return value


def _list(value: object, where: str) -> Sequence[Any]:
    if isinstance(value, list | tuple):
        return value
    raise ValueError(f"{where}: must be a list, not {type(value).__name__}")


def _call_from(data: object, where: str) -> ToolCall:
    call = _dict(data, where)
    _only(call, ("id", "type", "function"), where)
    if "type" in call and call["type"] != "function":
        raise ValueError(
            f"{where}.type: unknown tool call type {shown(call['type'])} (only 'function')"
        )
    if "function" not in call:
        raise ValueError(f"{where}.function: required key is missing")
    function = _dict(call["function"], f"{where}.function")
    _only(function, ("name", "arguments"), f"{where}.function")
    name = _text(function, "name", f"{where}.function")
    return ToolCall(
        _text(call, "id", where), name, _text(function, "arguments", f"{where}.function")
    )


def _message_from(data: object, where: str) -> ChatMessage:
    message = _dict(data, where)
    if "role" not in message:
        raise ValueError(f"{where}.role: required key is missing")
    role = message["role"]
    if not isinstance(role, str) or role not in ROLES:
        raise ValueError(f"{where}.role: unknown role {shown(role)} (one of {', '.join(ROLES)})")
    _only(message, _KEYS[role], where)
    if role == "system":
        return SystemMessage(_text(message, "content", where))
    if role == "user":
        return UserMessage(_text(message, "content", where))
    if role == "tool":
        return ToolMessage(_text(message, "tool_call_id", where), _text(message, "content", where))
    raw_calls = message.get("tool_calls")
    listed = () if raw_calls is None else _list(raw_calls, f"{where}.tool_calls")
    return AssistantMessage(
        content=_text(message, "content", where, optional=True),
        reasoning_content=_text(message, "reasoning_content", where, optional=True),
        tool_calls=tuple(
            _call_from(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(listed)
        ),
    )


def from_openai(dicts: Sequence[Mapping[str, Any]]) -> list[ChatMessage]:
    """OpenAI-style message dicts as messages; `ValueError` naming the index and key of the first
    malformed one. An assistant's `content`, `reasoning_content` and `tool_calls` may be missing or
    None (no text, no reasoning, no calls); a tool call's `type`, if given, is "function"."""
    listed = _list(dicts, "messages")
    return [_message_from(data, f"messages[{i}]") for i, data in enumerate(listed)]


def _tool_from(data: object, where: str) -> ToolSchema:
    tool = _dict(data, where)
    _only(tool, ("type", "function"), where)
    if "type" in tool and tool["type"] != "function":
        raise ValueError(f"{where}.type: unknown tool type {shown(tool['type'])} (only 'function')")
    if "function" not in tool:
        raise ValueError(f"{where}.function: required key is missing")
    where = f"{where}.function"
    function = _dict(tool["function"], where)
    _only(function, ("name", "description", "parameters"), where)
    if "parameters" not in function:
        raise ValueError(f"{where}.parameters: required key is missing (a JSON Schema object)")
    return ToolSchema(
        name=_text(function, "name", where),
        description=_text(function, "description", where),
        parameters=_json_object(function["parameters"], f"{where}.parameters", ValueError),
    )


def tools_from_openai(dicts: Sequence[Mapping[str, Any]]) -> list[ToolSchema]:
    """OpenAI-style tool dicts as `ToolSchema`s (`parameters` a copy); `ValueError` naming the
    index and key of the first malformed one."""
    return [_tool_from(data, f"tools[{i}]") for i, data in enumerate(_list(dicts, "tools"))]
