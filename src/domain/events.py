"""What comes back while a request runs. Nothing here is final: only a `Completion` is."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Queued:
    """Waiting for our own slot gate; `ahead` requests are before this one."""

    ahead: int


class ModelWait(enum.Enum):
    """What the server is doing with the model a request waits for (a router's, mostly)."""

    LOADING = "loading"  # loading it (charged to `load_wait_ms`)
    ASLEEP = "asleep"  # it sleeps, and the request wakes it (charged to `load_wait_ms`)
    BEHIND = "behind"  # not loaded: the router runs another model's work first (`busy_wait_ms`)


@dataclass(frozen=True, slots=True)
class Waiting:
    """Sent, no byte yet; one event per slot poll. `unresponsive`: the `/slots` probe found a
    server that took the connection and answered nothing in time (paused or stuck), as opposed
    to one that refused it or said it is loading. `model`: what the server said it is doing
    with the model instead (None: nothing, or it could not say)."""

    slot_busy: bool
    unresponsive: bool = False
    model: ModelWait | None = None


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
    """Reasoning was capped after `tokens` reasoning tokens: the server's thinking budget ended
    it there, or the client's `reasoning_end` call did (the fallback, counted when it was made)."""

    tokens: int


@dataclass(frozen=True, slots=True)
class Retrying:
    """The running attempt failed with `error`; attempt `attempt` follows in `after_ms`. With
    `resend`, it sends the request again: its events start from the beginning, and what the call
    emitted before this one is superseded (an answer shown so far is to be cleared). Without, it
    re-attaches: the events go on where they broke, none repeated."""

    attempt: int
    after_ms: int
    error: str
    resend: bool = False


class CacheCause(enum.Enum):
    """Why a request will not reuse what the slot's previous request left there."""

    MESSAGE_CHANGED = "message_changed"  # a message the previous request sent is changed or gone
    OPTIONS_CHANGED = (
        "options_changed"  # the tools or the thinking switch, rendered into the prompt
    )
    REASONING_DROPPED = "reasoning_dropped"  # the template renders the previous answer without it
    SLOT_EMPTIED = "slot_emptied"  # the server no longer holds them (a restart, a unified KV cache)


@dataclass(frozen=True, slots=True)
class CachePrediction:
    """Before the request is sent: it will reuse `reused` of the `previous` tokens the slot's
    previous request left in the slot. `lost` when that is short by more than `cache_loss_tokens`;
    then `message` is the index of the message (in this request) where the prompts diverge and
    `cause` why, each None where the client cannot tell. `restored`: tokens the client has just
    restored into the slot from its checkpoint (0: none)."""

    reused: int
    previous: int
    lost: bool
    message: int | None = None
    cause: CacheCause | None = None
    restored: int = 0


@dataclass(frozen=True, slots=True)
class SessionMoved:
    """The session's request was placed on `slot`, which does not hold its prompt: `previous` is
    the slot it ran on last (None: none yet), `evicted` the session whose prompt `slot` held (its
    checkpoint is saved first: `SessionSaved`), None when it held none."""

    session: str
    slot: int
    previous: int | None
    evicted: str | None


@dataclass(frozen=True, slots=True)
class SessionSaved:
    """`session`'s prompt, `tokens` tokens on `slot`, saved to its checkpoint (`bytes` on the
    server's disk, in `ms`) before another session's request overwrites it."""

    session: str
    slot: int
    tokens: int
    bytes: int
    ms: float


@dataclass(frozen=True, slots=True)
class SessionRestored:
    """`session`'s checkpoint, `tokens` tokens (`bytes` on the server's disk), put back into
    `slot` in `ms`, before its request: the request reuses them as the slot's own."""

    session: str
    slot: int
    tokens: int
    bytes: int
    ms: float


ChatEvent = (
    Queued
    | Waiting
    | SessionMoved
    | SessionSaved
    | SessionRestored
    | CachePrediction
    | Progress
    | Reasoning
    | Content
    | ToolCallDelta
    | ThinkingCapped
    | Retrying
)


class EventList(Protocol):
    """Where events are appended as they are made: a list of them, or of anything they are."""

    def append(self, event: ChatEvent, /) -> None: ...
    def extend(self, events: Iterable[ChatEvent], /) -> None: ...
    def __len__(self) -> int: ...
    def __delitem__(self, index: slice, /) -> None: ...
