"""Sessions on slots: which slot a session's request runs on, decided from what the client knows
of the slots, with no I/O (the I/O is `app._async.sessions`).

A daemon names a conversation by a key of its own (`ChatRequest(session="key", ...)`) and runs
more of them than the server has slots. The client places each request once per call:

1. the slot that holds the session's prompt (its last request ran there and nothing overwrote
   it since), even when it is busy: the request then queues there, as a `slot=` request does;
2. else a free slot: one that holds no session's prompt and that no call holds or waits for;
3. else the least recently placed slot that no call holds or waits for: the session whose prompt
   it holds is evicted (checkpointed first, once the slot is ours at the gate);
4. else (every slot busy) the least recently placed slot, queued for.

The gate's rules are unchanged: one request per slot, first come first served, `busy_wait_ms`.
Placing is a guess made before the gate; what the slot holds once it is ours decides what is
saved and restored (`arrival`), so two calls that race for one slot stay right whichever wins.
"""

from __future__ import annotations

import enum
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from domain.errors import RequestError
from domain.messages import ChatRequest

__all__ = [
    "SESSION_KEY_CHARS",
    "Arrival",
    "Placement",
    "SlotView",
    "Why",
    "arrival",
    "place",
    "placed",
    "session_of",
]

SESSION_KEY_CHARS = 256


def session_of(req: ChatRequest) -> str | None:
    """The request's session key (None: a `slot=` request, its slot checked with its body);
    `RequestError` unless it names exactly one of `slot` and `session`, or when the key is not a
    non-empty str of at most `SESSION_KEY_CHARS` characters without control characters."""
    if req.session is None:
        if req.slot is None:
            raise RequestError("a request needs slot= or session= (a key of the daemon's own)")
        return None
    if req.slot is not None:
        raise RequestError("a request names slot= or session=, not both: a session is placed")
    return check_session(req.session)


def check_session(key: object) -> str:
    """`key` if it may name a session, else `RequestError` saying why."""
    if not isinstance(key, str):
        raise RequestError(f"session must be a str, not {type(key).__name__}")
    if not key:
        raise RequestError("session must not be empty")
    if len(key) > SESSION_KEY_CHARS:
        raise RequestError(f"session is {len(key)} characters long, over {SESSION_KEY_CHARS}")
    for index, char in enumerate(key):
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise RequestError(f"session has a control character (U+{ord(char):04X}) at {index}")
    return key


def placed(req: ChatRequest) -> int:
    """The slot of a request the client has placed (a `slot=` request's own)."""
    if req.slot is None:
        raise RequestError("the request has no slot: a session's is placed before it is sent")
    return req.slot


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as the client sees it when a session asks for one: the session whose prompt it
    holds (None: none, or a `slot=` request's), whether a call holds it or waits for it, and when
    it was last placed on (a count that only grows; 0: never)."""

    slot: int
    holder: str | None
    busy: bool
    used: int


class Why(enum.Enum):
    """Why a session's request goes to its slot."""

    HOLDER = "holder"  # the slot holds its prompt
    FREE = "free"  # the slot holds no session's prompt and nobody uses it
    IDLE = "idle"  # the least recently used slot nobody uses: its session is evicted
    BUSY = "busy"  # every slot is in use: the least recently used, queued for


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a session's request goes, and why; `evicts` is the session whose prompt the slot
    holds now (None: none, or the session's own)."""

    slot: int
    why: Why
    evicts: str | None


def place(session: str, slots: Sequence[SlotView]) -> Placement:
    """The slot for `session`'s request (see the module); `slots` is every slot of the server."""
    if not slots:
        raise RequestError("the server has no slot to place a session on")
    for view in slots:
        if view.holder == session:
            return Placement(view.slot, Why.HOLDER, None)
    free = [view for view in slots if view.holder is None and not view.busy]
    if free:
        return Placement(_oldest(free).slot, Why.FREE, None)
    idle = [view for view in slots if not view.busy]
    chosen = _oldest(idle or slots)
    return Placement(chosen.slot, Why.IDLE if idle else Why.BUSY, chosen.holder)


def _oldest(views: Sequence[SlotView]) -> SlotView:
    return min(views, key=lambda view: (view.used, view.slot))


@dataclass(frozen=True, slots=True)
class Arrival:
    """What to do once a session's request holds its slot at the gate: save the prompt of the
    session `save` (the slot holds it, and the client knows what it is) before ours overwrites
    it; `restore` the session's own checkpoint (the slot does not hold its prompt); `moved`: the
    slot did not hold the session's prompt."""

    save: str | None
    restore: bool
    moved: bool


def arrival(session: str, holder: str | None, *, known: bool, checkpointed: bool) -> Arrival:
    """`session`'s request holds a slot whose prompt is `holder`'s (None: no session's); `known`:
    the client knows the request that left it there (it completed: a checkpoint of it can be
    checked before it is put back); `checkpointed`: `session` has a checkpoint."""
    if holder == session:
        return Arrival(None, restore=False, moved=False)
    save = holder if holder is not None and known else None
    return Arrival(save, restore=checkpointed, moved=True)
