"""What goes in: the four message kinds a chat template knows, tools, and one request.

Frozen dataclasses with slots: they are built once per request and never change, so a retry
renders the same bytes again.
"""

from __future__ import annotations

from collections.abc import Sequence
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


ChatMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage


@dataclass(frozen=True, slots=True)
class ToolSchema:
    """A function the model may call; `parameters` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat on one slot. `tools` is fixed for an epoch and may be empty."""

    slot: int
    messages: Sequence[ChatMessage]
    tools: Sequence[ToolSchema] = field(default_factory=tuple)
    thinking: bool = False
    tool_choice: ToolChoice = "auto"
