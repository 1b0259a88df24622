"""What a client knows of its sessions, shared by the blocking and the asyncio client of one
container (in `app.slot_memory.SlotMemory`), as they share the slot gate: which session's prompt
each slot holds, when each slot was last placed on, the calls placed on each slot and not yet
ended, each session's last completed request, and the sessions' checkpoints
(`domain.checkpoint_pool`).

Safe to share between threads: every method takes the book's lock, and none does I/O. The
decisions are `domain.sessions`'; `app._async.sessions` does the saves and restores.

Invariants:
- `holder(slot)` changes only while a call holds `slot` at the gate: `take` after the prompt
  the slot held was saved (so a session placed elsewhere meanwhile finds its checkpoint), and
  `vacate` when a `slot=` request overwrites it.
- A call's claim on its slot (`place`) lasts until `release`: two sessions placed at once never
  both take a slot as free.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from domain.checkpoint_pool import CheckpointPool
from domain.prompt_cache import Checkpoint, SlotTurn
from domain.sessions import Placement, SlotView, place

__all__ = ["SessionBook"]


class SessionBook:
    __slots__ = ("_claims", "_holders", "_last", "_lock", "_tick", "_turns", "_used", "pool")

    def __init__(self, cap_bytes: int, model: str = "") -> None:
        self._lock = threading.Lock()
        self._holders: dict[int, str] = {}
        self._used: dict[int, int] = {}
        self._claims: dict[int, int] = {}
        self._tick = 0
        self._turns: dict[str, SlotTurn] = {}
        self._last: dict[str, int] = {}
        self.pool = CheckpointPool(cap_bytes, model)

    def place(self, session: str, total_slots: int, busy: Callable[[int], bool]) -> Placement:
        """Place `session`'s request (`domain.sessions.place`), its slot claimed until `release`."""
        with self._lock:
            views = [
                SlotView(
                    slot,
                    self._holders.get(slot),
                    self._claims.get(slot, 0) > 0 or busy(slot),
                    self._used.get(slot, 0),
                )
                for slot in range(total_slots)
            ]
            placement = place(session, views)
            self._tick += 1
            self._used[placement.slot] = self._tick
            self._claims[placement.slot] = self._claims.get(placement.slot, 0) + 1
            return placement

    def release(self, slot: int) -> None:
        with self._lock:
            left = self._claims.get(slot, 0) - 1
            if left > 0:
                self._claims[slot] = left
            else:
                self._claims.pop(slot, None)

    def holder(self, slot: int) -> str | None:
        with self._lock:
            return self._holders.get(slot)

    def take(self, slot: int, session: str) -> int | None:
        """`session`'s prompt is what `slot` holds from now on; the slot it ran on before."""
        with self._lock:
            self._holders[slot] = session
            previous = self._last.get(session)
            self._last[session] = slot
            for other, holder in list(self._holders.items()):
                if holder == session and other != slot:
                    del self._holders[other]
            return previous

    def vacate(self, slot: int) -> None:
        """A `slot=` request overwrites whatever session's prompt `slot` held (unsaved)."""
        with self._lock:
            self._holders.pop(slot, None)

    def turn(self, session: str) -> SlotTurn | None:
        with self._lock:
            return self._turns.get(session)

    def landed(self, session: str, turn: SlotTurn) -> None:
        with self._lock:
            self._turns[session] = turn

    # -- the checkpoints (`domain.checkpoint_pool`, under the book's lock) ----------------------

    def checkpoint(self, session: str) -> Checkpoint | None:
        with self._lock:
            return self.pool.checkpoint(session)

    def file_for(self, session: str) -> str | None:
        with self._lock:
            return self.pool.file_for(session)

    def saved(self, session: str, checkpoint: Checkpoint) -> list[str]:
        with self._lock:
            return self.pool.saved(session, checkpoint)

    def failed(self, session: str, name: str) -> None:
        with self._lock:
            self.pool.failed(session, name)

    def drop(self, session: str) -> None:
        with self._lock:
            self.pool.drop(session)

    def begin_restore(self, session: str) -> Checkpoint | None:
        with self._lock:
            return self.pool.begin_restore(session)

    def end_restore(self, session: str) -> None:
        with self._lock:
            self.pool.end_restore(session)
