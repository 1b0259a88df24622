"""The I/O of sessions on slots: a session's request placed on a slot before its call sets out,
and, once the slot is ours at the gate, the prompt of the session it evicts saved to that
session's checkpoint and the session's own checkpoint restored. Written once; the blocking twin
(`app/_sync/sessions.py`) is generated from this file by `scripts/unasync.py`. The decisions are
`domain.sessions`' and `domain.checkpoint_pool`'s; the saves and restores are the prompt cache's
(`AsyncPromptCache.save_to`, `_restore`), in the turn's preparing phase, so whatever bounds the
turn's wait bounds them too.

Invariants:
- A session moves only through the gate: it is placed on one slot per call (`place`), and what
  the slot holds is read again once the slot is ours (`arrive`).
- A save or a restore that fails never fails the turn: the evicted session, or this one, starts
  cold (a WARNING). Only a cancel goes through. A server without `--slot-save-path` places
  sessions all the same, without checkpoints (the prompt cache's one WARNING).
- A checkpoint goes back only into a server with its template, model and slot context, before a
  request that begins with the prompt it covers (`restore_refusal`), as a slot's does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from app._async.info import AsyncServerInfo
from app.slot_memory import SlotMemory
from domain.cancel import CancelToken
from domain.errors import InferError, loggable
from domain.events import ChatEvent, SessionMoved, SessionRestored, SessionSaved
from domain.messages import ChatRequest
from domain.prompt_cache import Checkpoint, Rendered, restore_refusal
from domain.sessions import arrival

if TYPE_CHECKING:
    from app._async.prompt_cache import AsyncPromptCache

__all__ = ["AsyncSessions"]

log = logging.getLogger("inferpath.client")


def _idle(slot: int) -> bool:
    return False


class AsyncSessions:
    """Sessions on the slots of one client. Safe to share between calls: what it knows is the
    `SessionBook` of the shared `SlotMemory`."""

    def __init__(
        self,
        cache: AsyncPromptCache,
        *,
        info: AsyncServerInfo,
        memory: SlotMemory,
    ) -> None:
        self._cache = cache
        self._info = info
        self._memory = memory
        # whether a call holds a slot at the gate or waits for it: set by the calls (the gate's)
        self.busy: Callable[[int], bool] = _idle

    def has_checkpoint(self, session: str) -> bool:
        return self._memory.sessions.checkpoint(session) is not None

    async def place(self, req: ChatRequest, session: str, token: CancelToken) -> ChatRequest:
        """`req` on the slot `domain.sessions.place` gives `session` (claimed until `release`):
        the request that is sent, its slot set beside its session."""
        total = await self._info.slot_count(token)
        placement = self._memory.sessions.place(session, total, self.busy)
        log.debug("session placed on slot %d (%s)", placement.slot, placement.why.value)
        return dataclasses.replace(req, slot=placement.slot)

    def release(self, slot: int) -> None:
        """The call placed on `slot` has ended."""
        self._memory.sessions.release(slot)

    async def arrive(
        self, slot: int, session: str, token: CancelToken, events: list[ChatEvent]
    ) -> tuple[Checkpoint | None, bool]:
        """`session`'s request holds `slot`: save the prompt of the session the slot holds (if
        another's), take the slot; the session's checkpoint (kept from other saves until
        `done_with`), and whether it is to be restored (the slot did not hold its prompt)."""
        book = self._memory.sessions
        holder = book.holder(slot)
        checkpoint = book.begin_restore(session)
        saves = self._memory.saves
        known, checkpointed = slot in self._memory.turns, checkpoint is not None
        decided = arrival(session, holder, known=known, checkpointed=checkpointed)
        if not decided.moved:
            return checkpoint, False
        try:
            evicted = decided.save if saves else None
            saved = await self._save(slot, evicted, token) if evicted is not None else None
        except BaseException:  # a cancel: the caller never gets the checkpoint to be done with
            if checkpoint is not None:
                book.end_restore(session)
            raise
        previous = book.take(slot, session)
        self._memory.turns.pop(slot, None)  # another session's prompt: nothing to predict from
        events.append(SessionMoved(session, slot, previous, holder))
        if saved is not None:
            events.append(saved)
        return checkpoint, decided.restore

    def done_with(self, session: str) -> None:
        self._memory.sessions.end_restore(session)

    async def restore(
        self,
        slot: int,
        session: str,
        checkpoint: Checkpoint,
        now: Rendered,
        token: CancelToken,
        events: list[ChatEvent],
        within: float,
    ) -> int:
        """Put `session`'s checkpoint back into `slot` before its request (rendered `now`),
        awaiting its answer `within` seconds at most (what the turn's wait has left): the
        tokens restored (0: refused or failed, a WARNING); its last request becomes the slot's."""
        book, started = self._memory.sessions, self._now()
        try:
            props = await self._info.props(token, quick=True)
            refusal = restore_refusal(checkpoint, props, now.tokens)
            if refusal is None:
                here = dataclasses.replace(checkpoint, slot=slot)
                restored = await self._cache._restore(here, token, within=within)
                if restored:
                    turn = book.turn(session)
                    if turn is not None:
                        self._memory.turns[slot] = turn
                    ms = (self._now() - started) * 1000
                    events.append(SessionRestored(session, slot, restored, checkpoint.bytes, ms))
                    return restored
                refusal = "the server restored 0 tokens"
            else:
                book.drop(session)  # it will never fit this server or this session again
        except InferError as exc:
            token.raise_if_cancelled()
            refusal = loggable(exc)
        log.warning("slot %d: a session's checkpoint was not restored: %s", slot, refusal)
        return 0

    async def _save(self, slot: int, holder: str, token: CancelToken) -> SessionSaved | None:
        """Save `holder`'s prompt, which `slot` holds, to its checkpoint (a file of the pool)."""
        book, started = self._memory.sessions, self._now()
        name = book.file_for(holder)
        if name is None:
            return None
        checkpoint = None
        try:
            checkpoint = await self._cache.save_to(slot, name, token)
        except InferError as exc:
            token.raise_if_cancelled()
            why = loggable(exc)
            log.warning("slot %d: the prompt of the session it held was not saved: %s", slot, why)
        finally:
            if checkpoint is None:
                book.failed(holder, name)
        if checkpoint is None:
            return None
        dropped = book.saved(holder, checkpoint)
        if dropped:
            log.debug("%d sessions' checkpoints dropped under the disk cap", len(dropped))
        ms = (self._now() - started) * 1000
        return SessionSaved(holder, slot, checkpoint.tokens, checkpoint.bytes, ms)

    def _now(self) -> float:
        return self._info.clock.now()
