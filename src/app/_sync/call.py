# Generated from src/app/_async/call.py by scripts/unasync.py: do not edit.
"""What one client asks of llama-server: a chat from the slot gate to its `Completion` (retried
or not), and the small calls. The one source of the call: the blocking twin
(`app/_sync/call.py`) is generated from this file by `scripts/unasync.py`.

A chat is one loop (`chat`) over the attempt machine (`domain.attempt`): do the action of its
phase, tell it what happened, go round again. Every decision (what comes next, what a wait has
left, whether and how to retry) is the machine's, every byte of llama-server's API in
`domain.llama_api`; this module does the I/O. Invariants:
- Every wait has a deadline, so no path can hang: the gate's, the head's (the next poll), then
  the silence the stream allows (the head comes when the server starts our request).
- Nothing is returned before the final chunk. Every attempt's end closes its connection, stops
  the generation (a `DELETE`: closing no longer does) and gives the slot back (`_ended`).
- A retry sends the very same bytes (rendered once per call) back through the slot gate.
- Every I/O step takes the call's `CancelToken`: a cancelled call sends nothing more.
- Every request names the model, for a router; only the chat's own requests may load it.
- Log lines never carry the server's text (`loggable`).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Awaitable, Callable
from functools import partial
from logging import DEBUG
from typing import TypeVar

from app._sync.fetch import check_stream_head
from app._sync.flight import Chat
from app._sync.gate_wait import holding, queued
from app._sync.info import ServerInfo
from app._sync.prompt_cache import PromptCache
from app._sync.side_calls import Refused, named_cut, post_control, reattach, stop
from app.call_log import log_resent_at_once, log_retry
from app.calls import Uncut
from app.conversation_ids import ConversationIds
from app.event_stream import Step
from app.slot_memory import SlotMemory
from app.slot_queue import SlotQueue
from domain.attempt import Action, AttemptMachine, Input, Phase
from domain.cancel import CancelToken
from domain.chat_stream import ChatStream, PostReasoningEnd, prompt_token_bound
from domain.completion import Completion
from domain.errors import ConnectError, InferError, Stalled, StreamClosedEarly
from domain.events import Retrying
from domain.limits import ClientLimits
from domain.llama_api import CHAT_PATH, CONVERSATION_HEADER, stop_path
from domain.messages import ChatRequest
from domain.prompt_cache import CacheSettings
from domain.request import RequestSettings, build_control_body, effective_max_tokens
from domain.retry import Attempts, RetryPolicy
from domain.sessions import placed, session_of
from ports.clock import Clock
from ports.slot_probe import SlotProbe
from ports.transport import Transport, TimedOut

T = TypeVar("T")
_Steps = Generator[Step, None, None]
_Act = Callable[[Chat], _Steps]  # an action of the chat's loop that emits events as they come
_Work = Callable[[int, CancelToken], T]  # a save or a restore, the slot held

__all__ = ["LlamaCalls"]

log = logging.getLogger("inferpath.client")


class LlamaCalls:
    """The I/O of one client's calls, over the ports it is given. Safe to share between calls."""

    def __init__(
        self,
        *,
        transport: Transport,
        probe: SlotProbe,
        clock: Clock,
        queue: SlotQueue,
        retry_policy: RetryPolicy,
        request_settings: RequestSettings,
        limits: ClientLimits,
        total_slots: int | None,
        n_ctx: int | None = None,
        cache: CacheSettings,
        memory: SlotMemory | None = None,
    ) -> None:
        self._transport = transport
        self.probe = probe
        self._clock = clock
        self._queue = queue
        self._retry = retry_policy
        self._settings = request_settings
        self._limits = limits
        self._ids = ConversationIds()
        self.info = ServerInfo(
            transport=transport,
            clock=clock,
            request_settings=request_settings,
            limits=limits,
            total_slots=total_slots,
            n_ctx=n_ctx,
        )
        model = request_settings.model
        self.cache = PromptCache(info=self.info, settings=cache, model=model, memory=memory)
        self.cache.sessions.busy = queue.busy  # sessions go to slots nobody holds or waits for
        self._acts: dict[Action, _Act] = {
            Action.ENTER: self._enter,
            Action.PREPARE: self._prepare,
            Action.LOAD: self._load,
            Action.POLL: self._poll,
            Action.READ: self._read,
            Action.REATTACH: self._reattach,
        }

    def chat(self, req: ChatRequest, token: CancelToken, *, retry: bool) -> _Steps:
        """The steps of one chat, its events then its `Completion`: the machine's action done,
        round after round, until it is DONE; a failure handed to the machine, which decides
        (a re-send after a `Retrying`, a load, or the error raised; re-sends only if `retry`)."""
        session_of(req)  # RequestError: neither slot nor session, or both
        attempts = Attempts(self._retry, self._clock.now())
        slot = req.slot if req.slot is not None else 0  # a session's: placed at its first turn
        c = Chat(req, token, AttemptMachine(attempts, self._limits, slot, resend=retry))
        try:
            while (action := c.machine.action) is not Action.DONE:
                try:
                    if action is Action.SEND:
                        self._send(c)
                    elif action is Action.SLEEP:
                        self._sleep(c)
                    else:
                        for step in self._acts[action](c):
                            yield step
                except InferError as error:
                    if token.cancelled:
                        raise
                    now = self._clock.now()
                    taken = c.machine.failed(error, now)  # raised, if not retried
                    self._ended(c)
                    if taken is not None:  # (None: a router loads the model first)
                        yield log_retry(c.machine.slot, c.machine.attempts, taken, now)
        finally:
            try:
                self._ended(c)
            finally:
                if c.req.session is not None and c.req.slot is not None:
                    self.cache.sessions.release(c.req.slot)  # the session's claim on its slot

    def _enter(self, c: Chat) -> _Steps:
        """QUEUED: the body rendered (once per call: a request refused connects nothing), then
        the slot taken at the gate, a `Queued` each time the call moves up."""
        now, flight = self._clock.now, c.flight
        if not c.body:
            if c.req.slot is None and c.req.session is not None:  # placed once per call
                c.req = self.cache.sessions.place(c.req, c.req.session, c.token)
                c.machine.slot = placed(c.req)
            c.body = self.info.render(c.req, c.token)
            # A chat that sends at once (the slot free, no prediction first) connects ahead: the
            # proxy's accept runs while it sets out; never held through a wait nor made for nothing.
            slot = c.machine.slot
            if not self._queue.busy(slot) and not self.cache.wanted(slot, c.req.session):
                flight.link = self.info.link_ahead(c.token)
        slot = c.machine.slot
        ticket = flight.ticket = self._queue.enter(slot)
        since = queued_s = now()
        if ticket.ahead:
            flight.close()  # not held through a wait at the gate
            busy_wait_s = self._limits.busy_wait_s
            for event in queued(self._queue, self._clock, busy_wait_s, ticket, slot, c.token):
                yield event
            queued_s = now()  # the slot was busy: charged to busy_wait_ms
        c.machine.slot_free(queued_s - since, queued_s)

    def _prepare(self, c: Chat) -> _Steps:
        """PREPARING: the cache prediction (a checkpoint restored), within the turn's wait."""
        loaded = c.machine.charged.loaded  # a second refusal skips the prediction
        if c.req.session is not None or self.cache.wanted(c.machine.slot, c.req.session):
            c.flight.close()  # what `_enter` saw changed at the gate: no place held through I/O
        left_s = c.machine.preparing_left_s(self._clock.now())
        ahead = self.cache.before(c.req, c.body, c.token, loaded=loaded, restore_s=left_s)
        c.prediction, c.rendered = ahead.prediction, ahead.rendered
        c.machine.happened(Input.PREPARED)
        for event in ahead.events:  # a session's move, save and restore; the prediction
            yield event

    def _load(self, c: Chat) -> _Steps:
        """LOADING: a router loads the model (as the chat would), `Waiting` each poll."""
        for waiting in self.info.load(self.probe, c.machine, c.token):
            yield waiting
        c.machine.loaded()

    def _send(self, c: Chat) -> None:
        """SENDING: the request under a new id; its `ChatStream` made while it flies."""
        req, flight, token = c.req, c.flight, c.token
        token.raise_if_cancelled()  # a close() that began while we queued: nothing is sent
        limits, conversation, body = self._limits, self._ids.take(), c.body
        headers, link = ((CONVERSATION_HEADER, conversation),), flight.take_link()
        open_chat = partial(self._transport.open, place_wait=limits.busy_wait_s)  # as for a slot
        exchange = open_chat(
            "POST", CHAT_PATH, body, timeout=limits.poll_s, cancel=token, headers=headers, link=link
        )
        flight.exchange = exchange  # closed however the attempt ends
        self._ids.refill()  # the next request's id, made while this one's answer is awaited
        sent = self._clock.now()
        cap = effective_max_tokens(req, self._settings)
        prompt = prompt_token_bound(len(body), self.info.n_ctx)
        budget = req.thinking and self._settings.thinking_budget is not None
        stream = ChatStream(limits.stream, cap, sent, max_prompt_tokens=prompt, budget_sent=budget)
        flight.sending(conversation, exchange, stream)
        c.machine.sent(sent)

    def _poll(self, c: Chat) -> _Steps:
        """AWAITING_HEAD: the head, read until the next poll is due; none: the slot probed
        (`Waiting`), the wait's error raised after it. A head: the stream checked and started."""
        exchange, stream = c.flight.flying()
        now, wait, slot = self._clock.now, c.machine.wait, c.machine.slot
        assert wait is not None
        head = exchange.head(wait.timeout(now()))
        if isinstance(head, TimedOut):
            decision = c.machine.polled(now(), self.probe.state(slot, c.token))
            c.token.raise_if_cancelled()
            yield decision.event
            if decision.error is not None:
                raise decision.error
            return
        if log.isEnabledFor(DEBUG):  # (its figures cost calls on the way to the first token)
            age_ms = wait.age_ms(now())
            log.debug("slot %d: response head %d after %.0f ms", slot, head.status, age_ms)
        if head.status != 200:
            c.flight.generating = None  # an error answer: nothing runs
        check_stream_head(exchange, head, self._clock, self._limits)
        stream.resumed(started := now())
        c.flight.take_off(started)
        c.machine.happened(Input.HEAD)

    def _read(self, c: Chat) -> _Steps:
        """STREAMING: the stream, read by read (the hot path), fed to its `ChatStream`, every
        step emitted; the `Completion` ends it, a cut or a stall hands it to the machine."""
        flight = c.flight
        exchange, stream = flight.flying()
        read, now, consumed = exchange.read, self._clock.now, flight.consumed
        while True:
            try:
                data = read(stream.timeout(now()))
                if isinstance(data, TimedOut):
                    stream.silence(now())
                    continue
            except (StreamClosedEarly, Stalled) as broke:
                flight.consumed = consumed
                yield self._cut(c, broke)
                return
            consumed += len(data)
            for step in stream.feed(data, now()):
                if isinstance(step, PostReasoningEnd):
                    yield stream.control_answered(self._reasoning_end(step, c.token))
                elif isinstance(step, InferError):
                    if isinstance(step, StreamClosedEarly):  # an end without the final chunk
                        raise self._named(step, c.token)  # an unload?
                    if not isinstance(step, Stalled):
                        raise step
                    flight.consumed = consumed  # late bytes past the limit: a stall
                    yield self._cut(c, step)
                    return
                elif isinstance(step, Completion):
                    c.machine.happened(Input.COMPLETED)
                    flight.generating = None  # nothing to stop
                    self.cache.landed(c.req, c.body, c.rendered, c.prediction, step)
                    yield step
                    return
                else:
                    if flight.first:
                        flight.first_token(step, now())
                    yield step

    def _cut(self, c: Chat, broke: InferError) -> Retrying:
        """A break after the head (a cut, a stall, a failed re-attach): the machine's `Retrying`
        before a re-attach, or raised when the retry policy allows no more."""
        c.token.raise_if_cancelled()  # a cancel's own shutdown of the connection: the call ends
        c.flight.close()
        now, offset = self._clock.now(), c.flight.consumed
        taken = c.machine.cut_at(broke, now, offset)
        return log_retry(c.machine.slot, c.machine.attempts, taken, now, offset=offset)

    def _sleep(self, c: Chat) -> None:
        """BACKING_OFF: the retry's wait, then what the machine decided (re-attach, re-send)."""
        assert c.machine.pending is not None
        self._clock.sleep(c.machine.pending.after_s, c.token)
        c.token.raise_if_cancelled()
        c.machine.slept()

    def _reattach(self, c: Chat) -> _Steps:
        """REATTACHING: the rest of the body from the bytes consumed, on a new connection; a
        break a `Retrying` (the machine's), a refusal (404, 400) a re-send at once, if allowed."""
        flight, machine = c.flight, c.machine
        try:
            reattach(self._transport, self._clock, self._limits, flight, c.token)
            machine.happened(Input.PICKED_UP)
        except (StreamClosedEarly, Stalled, ConnectError) as broke:
            yield self._cut(c, broke)
        except Refused:
            machine.name_cut(cut := self._named(machine.refused_cut(), c.token))
            flight.forget_stream()
            event = machine.refused()  # the cut raised, if the call may not re-send
            if flight.generating is not None:  # a lost offset: it may still be running
                self._stop(flight.generating)
            log_resent_at_once(c.machine.slot, event.attempt, cut)
            yield event

    def _ended(self, c: Chat) -> None:
        """The attempt's end, however it ends: its connections closed, what the slot holds
        forgotten unless it completed, its generation stopped, the slot given back."""
        flight = c.flight
        flight.close()
        if flight.sent and c.machine.phase is not Phase.DONE:  # the slot holds what we know not
            self.cache.forget(c.machine.slot)
        try:  # the slot is given back however the stop ends; a cancel does not cut the stop
            if flight.generating is not None:
                Uncut.run(self._stop, flight.generating)
        finally:
            if flight.ticket is not None:
                self._queue.leave(flight.ticket)
            flight.ended()

    def _stop(self, conversation: str) -> None:
        """Stop the generation of `conversation` (closing its connection no longer does): a
        `DELETE` within `STOP_WAIT_S` (`app._sync.fetch.stop`), whatever the call's state."""
        stop(self._transport, self._clock, stop_path(conversation), self._limits)

    def _reasoning_end(self, step: PostReasoningEnd, token: CancelToken) -> str | None:
        """End the thinking block on a second connection: None if accepted, else why not."""
        body = build_control_body(step.completion_id, self._settings.model)
        limits = self._limits.control()
        refusal = post_control(self._transport, self._clock, body, limits, token)
        log.debug("reasoning_end posted: %s", "accepted" if refusal is None else "refused")
        return refusal

    def _named(self, cut: InferError, token: CancelToken) -> InferError:
        """A cut the server cannot mend, named for an unload when a router says so (`named_cut`)."""
        limits, model = self._limits.control(), self._settings.model
        return named_cut(self._transport, self._clock, limits, model, cut, token)

    def holding(self, slot: int, token: CancelToken, work: _Work[T]) -> T:
        """`work` on `slot` (a save, a restore: `PromptCache`), the slot held at the gate."""
        slot = self.info.check_slot(slot, token)
        return holding(self._queue, self._clock, self._limits.busy_wait_s, slot, token, work)
