# Generated from src/app/_async/prompt_cache.py by scripts/unasync.py: do not edit.
"""The I/O of the slot's prompt cache: the prediction before a request is sent, the slot
checkpoints, and the automatic restore. Written once; the blocking twin
(`app/_sync/prompt_cache.py`) is generated from this file by `scripts/unasync.py`. The decisions
are `domain.prompt_cache`'s.

Before a chat request (the slot held at the gate), when `[cache] predict` is on, or the slot has a
checkpoint and a request completed on it before: `POST /apply-template` with the very body the
chat sends, `POST /tokenize` of the prompt it renders, and `GET /slots` for what the slot holds
now; then `CachePrediction`. When the slot was emptied (the server restarted, a unified KV cache)
and its checkpoint matches the server and the request, the checkpoint is restored first, and the
turn's `cache_n` says whether that helped (a WARNING when it did not).

Invariants:
- The prediction's requests and the `/props` read before a restore run on the server's HTTP
  thread and are answered at once: each gets the probe's short limits (`ClientLimits.probe()`).
  The restore works on the slot (it reads the file into it), so its answer may take what the
  turn's `load_wait_ms` has left. Their time is charged to the turn's wait for its head
  (`domain.attempt`): a server wedged at one of them delays the turn by no budget of its own.
- The prediction never fails a turn: a server that cannot render (404, 501) turns it off with one
  WARNING; any other failure skips it for that turn (DEBUG). Only a cancel goes through.
- A server without `--slot-save-path` (501) turns checkpoints off with one WARNING: `save_slot`
  then returns None without asking again. One that cannot render still saves: the checkpoint
  then has no prompt on record, and only `restore_slot` puts it back.
- A checkpoint is restored only into a server with its template, model and slot context, before
  a request that begins with the prompt it covers: the server itself checks none of it.
- The client remembers, per slot, its last completed request and checkpoint; per session, the
  same (`app._sync.sessions`), under the disk cap (`[cache] session_disk_mb`).
"""

from __future__ import annotations

import dataclasses
import logging

from app._sync.info import ServerInfo
from app._sync.sessions import Sessions
from app.call_log import log_done
from app.slot_memory import SlotMemory
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.errors import HttpError, InferError, ModelNotLoaded, RequestError, loggable
from domain.events import CacheCause, CachePrediction, ChatEvent
from domain.llama_api import (
    APPLY_TEMPLATE_PATH,
    SLOT_ACTIONS_UNSUPPORTED,
    SLOTS_PATH,
    TOKENIZE_PATH,
    parse_rendered,
    parse_slot_action,
    parse_token_ids,
    slot_action_body,
    slot_action_path,
    slot_held,
    token_ids_body,
)
from domain.messages import ChatRequest
from domain.prompt_cache import (
    CacheSettings,
    Checkpoint,
    Prepared,
    Rendered,
    SlotTurn,
    checkpoint_filename,
    covered,
    held_after_restore,
    predict,
    restore_refusal,
    server_model,
)
from domain.sessions import placed

__all__ = ["PromptCache"]

log = logging.getLogger("inferpath.client")

_CANNOT_RENDER = frozenset({404, 501})


class PromptCache:
    """Per slot: the last request completed on it and its checkpoint. Safe to share between calls
    (a slot's entries change only while the slot is held at the gate)."""

    def __init__(
        self,
        *,
        info: ServerInfo,
        settings: CacheSettings,
        model: str,
        memory: SlotMemory | None = None,
    ) -> None:
        self._info = info
        self._settings = settings
        self._model = model
        self._memory = (
            memory if memory is not None else SlotMemory()
        )  # shared with the other flavour's client
        self.sessions = Sessions(self, info=info, memory=self._memory)

    def checkpoint(self, slot: int) -> Checkpoint | None:
        return self._memory.checkpoints.get(slot)

    # -- the prediction -----------------------------------------------------------------------

    def forget(self, slot: int) -> None:
        """A request reached the server on `slot` and did not complete (cancelled, failed, sent
        again): what the slot holds now is not what its last completed request left there, so
        the next turn is not predicted from that one."""
        self._memory.turns.pop(slot, None)

    def wanted(self, slot: int, session: str | None = None) -> bool:
        """Whether a turn on `slot` is predicted (or its checkpoint may be restored) before it is
        sent; a session's checkpoint is its own, not the slot's."""
        memory = self._memory
        if not memory.renders:
            return False
        if session is None:
            return self._settings.predict or (slot in memory.checkpoints and slot in memory.turns)
        checkpointed = self.sessions.has_checkpoint(session)
        return self._settings.predict or (checkpointed and slot in memory.turns)

    def before(
        self,
        req: ChatRequest,
        body: bytes,
        token: CancelToken,
        *,
        restore_s: float,
        loaded: bool = False,
    ) -> Prepared:
        """What comes before `req` is sent, the slot held at the gate: for a session's request,
        its arrival on the slot (`Sessions.arrive`: the prompt of the session it evicts
        saved, its own checkpoint restored); then the prediction (None without a previous
        request on the slot) and the rendering (kept for the next one), restoring the slot's
        checkpoint if it was emptied. `ModelNotLoaded` from a router that has not loaded the
        model (the caller waits for it to load, then asks again with `loaded`: a second refusal
        skips the prediction). A restore's answer is awaited `restore_s` at most: what the
        turn's wait has left for it."""
        slot, session = placed(req), req.session
        events: list[ChatEvent] = []
        if session is None:
            self._memory.sessions.vacate(slot)
            checkpoint = self._memory.checkpoints.get(slot)
            prepared = self._prepare(req, body, token, loaded, restore_s, checkpoint)
            return Prepared.of(events, *prepared)
        checkpoint, moving = self.sessions.arrive(slot, session, token, events)
        try:
            moved = (checkpoint, events) if moving else None
            prepared = self._prepare(req, body, token, loaded, restore_s, checkpoint, moved)
            return Prepared.of(events, *prepared)
        finally:
            if checkpoint is not None:
                self.sessions.done_with(session)

    def _prepare(
        self,
        req: ChatRequest,
        body: bytes,
        token: CancelToken,
        loaded: bool,
        restore_s: float,
        checkpoint: Checkpoint | None,
        moved: tuple[Checkpoint | None, list[ChatEvent]] | None = None,
    ) -> tuple[CachePrediction | None, Rendered | None]:
        """The rendering and the prediction; `checkpoint` is the slot's or the session's. With
        `moved`, the session's checkpoint goes back into the slot first (`Sessions.restore`,
        its event added to the events)."""
        slot, session = placed(req), req.session
        moving = moved is not None and checkpoint is not None and self._memory.renders
        if not (moving or self.wanted(slot, session)):
            return None, None
        rendering = True  # a 404 or 501 here, and only here, says the server cannot render
        now: Rendered | None = None
        try:
            now = self._render(body, token)
            restored = 0
            if moving and moved is not None and checkpoint is not None and session is not None:
                said = moved[1]
                restored = self.sessions.restore(
                    slot, session, checkpoint, now, token, said, restore_s
                )
            previous = self._memory.turns.get(slot)
            if previous is None or (moving and not self._settings.predict):
                return None, now
            before = previous.rendered
            if before is None:  # never rendered: not rendered now, so a turn costs three at most
                return None, now
            rendering = False
            loss = self._settings.loss_tokens
            if restored and checkpoint is not None:  # the session's, just put back
                kept = held_after_restore(before, checkpoint, restored)
                return predict(previous, before, req, now, kept, loss, restored=restored), now
            held = slot_held(self._info.get(SLOTS_PATH, token, quick=True), slot)
            prediction = predict(previous, before, req, now, held, loss)
            if prediction.cause is CacheCause.SLOT_EMPTIED and checkpoint is not None:
                here = dataclasses.replace(checkpoint, slot=slot)  # a session's: saved elsewhere
                restored = self._restore_before(here, now, token, restore_s) or 0
                if restored:
                    held = held_after_restore(before, checkpoint, restored)
                    prediction = predict(previous, before, req, now, held, loss, restored=restored)
        except InferError as exc:
            token.raise_if_cancelled()
            if isinstance(exc, ModelNotLoaded) and now is None and not loaded:
                raise
            if not (rendering and self._cannot_render(exc)):
                log.debug("slot %d: cache prediction skipped: %s", slot, loggable(exc))
            return None, now  # a rendering made is kept: the next turn need not make it again
        log.debug("slot %d: %s", slot, prediction)
        return prediction, now

    def landed(
        self,
        req: ChatRequest,
        body: bytes,
        rendered: Rendered | None,
        prediction: CachePrediction | None,
        completion: Completion,
    ) -> None:
        """Remember the completed request (for the slot, and for its session) and log it
        (`app.call_log.log_done`, against the one before it on the slot); check a restore by
        the cache the turn found."""
        slot, loss = placed(req), self._settings.loss_tokens
        previous = self._memory.turns.get(slot)
        turn = self._memory.turns[slot] = SlotTurn.of(req, body, rendered, completion)
        if req.session is not None:
            self._memory.sessions.landed(req.session, turn)
        log_done(slot, completion, None if previous is None else previous.timings, loss)
        if prediction is None:
            return
        found = completion.timings.cache_n
        log.debug("slot %d: cache predicted %d tokens, found %d", slot, prediction.reused, found)
        if prediction.restored and prediction.reused - found > loss:
            log.warning(
                "slot %d: the restored checkpoint did not help: the turn reused %d tokens, not %d",
                slot,
                found,
                prediction.reused,
            )

    def _cannot_render(self, exc: InferError) -> bool:
        """Whether `exc`, the failure of a rendering, says the server cannot render (404, 501):
        then the prediction is off for good, with one WARNING."""
        if not (isinstance(exc, HttpError) and exc.status in _CANNOT_RENDER):
            return False
        if self._memory.renders:
            self._memory.renders = False
            log.warning(
                "cache prediction off: the server cannot render a prompt (HTTP %d)", exc.status
            )
        return True

    def _render(self, body: bytes, token: CancelToken, *, quick: bool = True) -> Rendered:
        text = parse_rendered(self._info.post(APPLY_TEMPLATE_PATH, body, token, quick=quick))
        ids = token_ids_body(text, self._model)
        tokens = parse_token_ids(self._info.post(TOKENIZE_PATH, ids, token, quick=quick))
        return Rendered.of(text, tokens)

    # -- checkpoints --------------------------------------------------------------------------

    def save(self, slot: int, token: CancelToken) -> Checkpoint | None:
        """Save what slot `slot` holds to the server's save folder and remember it; None when the
        server keeps no checkpoints (501, one WARNING, and never asked again)."""
        checkpoint = self.save_to(slot, checkpoint_filename(slot, self._model), token)
        if checkpoint is not None:
            self._memory.checkpoints[slot] = checkpoint
        return checkpoint

    def save_to(self, slot: int, name: str, token: CancelToken) -> Checkpoint | None:
        """Save what slot `slot` holds to the file `name`, with the prompt it covers on record
        (the slot's last completed request); None as `save`."""
        if not self._memory.saves:
            return None
        props = self._info.props(token)
        count, digest = covered(())
        previous = self._memory.turns.get(slot)
        if previous is not None and (previous.rendered is not None or self._memory.renders):
            try:  # the prompt it covers, on record; a server that cannot render saves without one
                rendered = previous.rendered or self._render(
                    previous.body, token, quick=False
                )
                self._memory.turns[slot] = dataclasses.replace(previous, rendered=rendered)
                count, digest = covered(rendered.tokens)
            except InferError as exc:
                if not self._cannot_render(exc):
                    raise
        try:
            answer = self._info.post(
                slot_action_path(slot, "save"), slot_action_body(name, self._model), token
            )
        except HttpError as exc:
            if exc.status != SLOT_ACTIONS_UNSUPPORTED:
                raise
            self._memory.saves = False
            log.warning(
                "slot checkpoints off: the server keeps none"
                " (HTTP 501: started without --slot-save-path)"
            )
            return None
        saved, size = parse_slot_action(
            answer, "n_saved", "n_written", f"POST {SLOTS_PATH}/{slot}?action=save"
        )
        log.debug("slot %d: saved %d tokens (%d bytes)", slot, saved, size)
        template, model, ctx = props.chat_template_sha256, server_model(props), props.n_ctx
        return Checkpoint(slot, name, saved, size, template, model, ctx, count, digest)

    def restore(self, slot: int, token: CancelToken) -> int:
        """Put slot `slot`'s checkpoint back; the tokens restored. `RequestError` when it has
        none, or when the server's template, model or slot context is not the one it was saved
        under."""
        checkpoint = self._memory.checkpoints.get(slot)
        if checkpoint is None:
            raise RequestError(f"slot {slot} has no checkpoint (save_slot makes one)")
        refusal = restore_refusal(checkpoint, self._info.props(token), None)
        if refusal is not None:
            raise RequestError(f"the checkpoint of slot {slot} was not restored: {refusal}")
        return self._restore(checkpoint, token)

    def _restore_before(
        self, checkpoint: Checkpoint, now: Rendered, token: CancelToken, within: float
    ) -> int | None:
        """The automatic restore into an emptied slot: the tokens restored, or None (a WARNING)."""
        slot = checkpoint.slot
        try:
            props = self._info.props(token, quick=True)
            refusal = restore_refusal(checkpoint, props, now.tokens)
            if refusal is None:
                if restored := self._restore(checkpoint, token, within=within):
                    return restored
                refusal = "the server restored 0 tokens"
        except InferError as exc:
            token.raise_if_cancelled()
            refusal = loggable(exc)
        log.warning("slot %d: emptied, and its checkpoint was not restored: %s", slot, refusal)
        return None

    def _restore(
        self,
        saved: Checkpoint,
        token: CancelToken,
        *,
        within: float | None = None,
    ) -> int:
        slot, body = saved.slot, slot_action_body(saved.filename, self._model)
        path = slot_action_path(slot, "restore")
        answer = self._info.post(path, body, token, within=within)
        restored, _ = parse_slot_action(
            answer, "n_restored", "n_read", f"POST {SLOTS_PATH}/{slot}?action=restore"
        )
        log.debug("slot %d: restored %d tokens", slot, restored)
        return restored
