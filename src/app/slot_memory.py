"""What a client remembers of each of the server's slots, for its prompt cache
(`app._async.prompt_cache`): the last request completed on the slot, its last checkpoint, and
whether the server renders prompts and keeps checkpoints at all.

The blocking and the asyncio client of one container share one `SlotMemory`, as they share the
slot gate: a turn one flavour completed is the turn the other's prediction starts from, and a
checkpoint one saved is the one the other restores. A slot's entries change only while a call
of either flavour holds the slot at the gate. `sessions` is what they know of the sessions
(`app.session_book`): which slot holds whose prompt, and the sessions' checkpoints.
"""

from __future__ import annotations

from app.session_book import SessionBook
from domain.prompt_cache import Checkpoint, SlotTurn

__all__ = ["SlotMemory"]


class SlotMemory:
    """Per slot, its last completed request and its last checkpoint; per server, what it can do."""

    __slots__ = ("checkpoints", "renders", "saves", "sessions", "turns")

    def __init__(self, *, session_disk_bytes: int = 0, model: str = "") -> None:
        """`session_disk_bytes`: the cap on the sessions' checkpoints (`domain.checkpoint_pool`);
        `model`: the config's model, in the names of their files."""
        self.turns: dict[int, SlotTurn] = {}
        self.checkpoints: dict[int, Checkpoint] = {}
        self.renders = True  # until a render is answered 404 or 501: the prediction is off for good
        self.saves = True  # until a save is answered 501: the server keeps no checkpoints
        self.sessions = SessionBook(session_disk_bytes, model)
