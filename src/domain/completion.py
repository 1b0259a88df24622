"""What comes back at the end. Nothing is final before this."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from domain.messages import AssistantMessage, ToolCall


class FinishReason(enum.Enum):
    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"


@dataclass(frozen=True, slots=True)
class Timings:
    """Token counts of one request; `cache_n + prompt_n` is the prompt length."""

    cache_n: int = 0
    prompt_n: int = 0
    predicted_n: int = 0

    @property
    def total(self) -> int:
        return self.cache_n + self.prompt_n + self.predicted_n


@dataclass(frozen=True, slots=True)
class Completion:
    id: str
    content: str | None
    reasoning_content: str | None
    tool_calls: Sequence[ToolCall] = field(default_factory=tuple)
    finish_reason: FinishReason = FinishReason.STOP
    timings: Timings = field(default_factory=Timings)
    reasoning_tokens: int = 0
    thinking_capped: bool = False

    def message(self) -> AssistantMessage:
        """The answer as the next turn sends it back: its content, reasoning and tool calls as
        they came, so that the next request renders the answer as it was generated, which the
        slot's prompt cache can reuse (`domain.prompt_cache`)."""
        return AssistantMessage(self.content, self.reasoning_content, tuple(self.tool_calls))
