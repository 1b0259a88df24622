"""What goes in: the four message kinds a chat template knows, tools, and one request.

Frozen dataclasses with slots: they are built once per request and never change, so a retry
renders the same bytes again.

A request may override, for itself alone, what otherwise comes from the config: `max_tokens`,
the sampling settings (`Sampling`, each field `None` = the config's value) and `stop`; and it may
ask for constrained output (`response_format`). `domain.request` checks every one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

ToolChoice = Literal["auto", "required", "none"]
TOOL_CHOICES: tuple[str, ...] = ("auto", "required", "none")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made. `arguments` is the raw JSON text exactly as the server sent it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class SystemMessage:
    content: str


@dataclass(frozen=True, slots=True)
class UserMessage:
    content: str


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: Sequence[ToolCall] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class ToolMessage:
    tool_call_id: str
    content: str

    @classmethod
    def answering(cls, call: ToolCall, content: str) -> ToolMessage:
        """The result of `call`, sent back after the assistant message that made it: the message
        carries the call's id, which is how the template pairs the two. `content` is the text the
        model reads; a result held as a dict or list is serialised first (to JSON text, say), as
        only the caller knows how it should read."""
        if not isinstance(call, ToolCall):
            raise TypeError(f"call must be a ToolCall, not {type(call).__name__}")
        if not isinstance(call.id, str):
            raise TypeError(f"call.id must be a str, not {type(call.id).__name__}")
        if not isinstance(content, str):
            raise TypeError(
                f"content must be a str, not {type(content).__name__}{_how_to_text(content)}"
            )
        return cls(call.id, content)


def _how_to_text(value: object) -> str:
    if isinstance(value, Mapping | list | tuple):
        return ": serialise the result to text first (JSON, say: json.dumps(result))"
    if isinstance(value, bytes | bytearray):
        return ": decode it to text first"
    return ""


ChatMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage


@dataclass(frozen=True, slots=True)
class ToolSchema:
    """A function the model may call; `parameters` is a JSON Schema object, held (as is
    `ChatRequest.response_format`) to the rule of `domain.json_check`: string keys, JSON values,
    finite numbers, bounded depth and size."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling settings for one request. A field left `None` keeps the config's value."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat, on one slot or in one session. `tools` is fixed for an epoch and may be empty.

    Exactly one of `slot` and `session`: `slot` pins the request to that slot; `session` is the
    daemon's own key for a conversation (a non-empty str of at most 256 characters, no control
    characters), which the client places on a slot itself (`domain.sessions`), moving it between
    slots through checkpoints when there are more sessions than slots.

    `max_tokens`, `sampling`, `stop`, `response_format` and `prefill` are per-request options; left
    at their defaults, the request renders exactly as it would without them. `max_tokens` and
    `sampling` replace the config's values for this request only; `stop` adds stop strings (the
    server cuts the answer before the first one it meets); `response_format` is the
    chat-completions object that constrains the answer, e.g. `{"type": "json_schema",
    "json_schema": {"name": "person", "schema": {...}}}`, sent exactly as given; `prefill` is the
    answer's opening, sent after the messages as an assistant message the server goes on from (the
    opening of a tool call in the template's syntax forces a call where `tool_choice` alone does
    not), and kept out of the history.
    """

    slot: int | None = None
    messages: Sequence[ChatMessage] = ()
    tools: Sequence[ToolSchema] = field(default_factory=tuple)
    thinking: bool = False
    tool_choice: ToolChoice = "auto"
    max_tokens: int | None = None
    sampling: Sampling | None = None
    stop: tuple[str, ...] = ()
    response_format: Mapping[str, Any] | None = None
    prefill: str | None = None
    session: str | None = None
