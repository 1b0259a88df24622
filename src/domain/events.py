"""What comes back while a request runs. Nothing here is final: only a `Completion` is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Queued:
    """Waiting for our own slot gate; `ahead` requests are before this one."""

    ahead: int


@dataclass(frozen=True, slots=True)
class Waiting:
    """Sent, no byte yet; one event per slot poll. `unresponsive`: the `/slots` probe found a
    server that took the connection and answered nothing in time (paused or stuck), as opposed
    to one that refused it or said it is loading."""

    slot_busy: bool
    unresponsive: bool = False


@dataclass(frozen=True, slots=True)
class Progress:
    """Prompt processing: `processed` counts cached tokens too."""

    total: int
    cache: int
    processed: int


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Content:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class ThinkingCapped:
    """The client asked the server to end reasoning after `tokens` reasoning tokens."""

    tokens: int


@dataclass(frozen=True, slots=True)
class Retrying:
    attempt: int
    after_ms: int
    error: str


ChatEvent = Queued | Waiting | Progress | Reasoning | Content | ToolCallDelta | ThinkingCapped | Retrying
