"""What one client asks of llama-server, step by step: a chat from the slot gate to its
`Completion` (retried or not), and the small calls. The one source of the call: the blocking
twin (`app/_sync/call.py`) is generated from this file by `scripts/unasync.py`.

A chat (the brief, section 4): gate (Queued) -> cache prediction (CachePrediction, a checkpoint
restored; a router's model loaded first: Waiting) -> send -> head wait (a probe each poll_ms:
Waiting) -> the stream, fed to `domain.chat_stream` (liveness, thinking cap) -> Completion

Every rule lives in the domain (`FirstByteWait`, `ChatStream`, `RetryPolicy`, `SlotGate`, ...),
every byte of llama-server's API in `domain.llama_api`, the I/O behind the ports. Invariants:
- Every wait has a deadline, so no path can hang: at the gate, `busy_wait_ms`; before the
  response head, the next poll; from the head on (llama-server sends it only when it starts our
  request, so it is the brief's "first byte"), the silence the stream allows.
- Nothing is returned before the final chunk. Every way out closes the stream's connection,
  stops the generation (a `DELETE`: closing no longer does) and gives the slot back.
- A retry sends the very same bytes (rendered once per call) back through the slot gate.
- Every I/O step takes the call's `CancelToken`: the blocking flavour is woken by it in whatever
  phase it is, and a cancelled call never sends a request or starts a retry.
- Every request names the model (`?model=` on a GET, `model` in a POST body), for a router;
  only the chat's own requests may load it.
- Log lines carry statuses, error types, counts and times, never the server's text (`loggable`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial
from logging import DEBUG
from typing import TypeVar

from app._async.fetch import check_stream_head, named_cut, post_control, stop
from app._async.flight import Flight, Refused
from app._async.info import AsyncServerInfo
from app._async.prompt_cache import AsyncPromptCache
from app.call_log import log_resent_at_once, log_retry
from app.calls import AsyncUncut
from app.conversation_ids import ConversationIds
from app.event_stream import Step
from app.slot_memory import SlotMemory
from app.slot_queue import AsyncSlotQueue
from domain.attempt import Input, Phase
from domain.cancel import CancelToken
from domain.chat_stream import ChatStream, PostReasoningEnd, prompt_token_bound
from domain.completion import Completion
from domain.errors import ConnectError, InferError, Stalled, StreamClosedEarly
from domain.events import Queued, Retrying, Waiting
from domain.gate import Ticket
from domain.limits import ClientLimits
from domain.llama_api import (
    CHAT_PATH,
    CONVERSATION_HEADER,
    REATTACH_REFUSED,
    STREAM_PATH,
    reattach_later,
    reattach_path,
    stop_path,
)
from domain.messages import ChatRequest
from domain.prompt_cache import CacheSettings, Checkpoint
from domain.request import RequestSettings, build_control_body, effective_max_tokens
from domain.retry import Attempts, RetryPolicy
from domain.waiting import FirstByteWait, gate_timeout
from ports.clock import AsyncClock
from ports.slot_probe import AsyncSlotProbe
from ports.transport import AsyncExchange, AsyncTransport, TimedOut

T = TypeVar("T")

__all__ = ["AsyncLlamaCalls"]

log = logging.getLogger("inferpath.client")


class AsyncLlamaCalls:
    """The I/O of one client's calls, over the ports it is given. Safe to share between calls."""

    def __init__(
        self,
        *,
        transport: AsyncTransport,
        probe: AsyncSlotProbe,
        clock: AsyncClock,
        queue: AsyncSlotQueue,
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
        self.info = AsyncServerInfo(
            transport=transport,
            clock=clock,
            request_settings=request_settings,
            limits=limits,
            total_slots=total_slots,
            n_ctx=n_ctx,
        )
        self.cache = AsyncPromptCache(info=self.info, settings=cache, model=request_settings.model, memory=memory)

    # -- a chat -------------------------------------------------------------------------------

    def attempts(self) -> Attempts:  # those of a call starting now
        return Attempts(self._retry, self._clock.now())

    def sends_at_once(self, slot: int) -> bool:
        """Whether a chat on `slot` sends at once (the slot free here, no prediction first): only
        then is a connection made ahead for it, never held through a wait nor spent for nothing."""
        return not self._queue.busy(slot) and not self.cache.wanted(slot)

    async def attempt(
        self, req: ChatRequest, body: bytes, token: CancelToken, flight: Flight
    ) -> AsyncGenerator[Step, None]:
        """One attempt through the slot gate (queued, emitting `Queued`, at most `busy_wait_ms`):
        the request, its head (with its polls), then the stream to its `Completion`. A stream cut
        or stalled after its head is re-attached (`_take_off`) and fed on into the same
        `ChatStream`, the slot held; every end but the `Completion` stops the generation."""
        slot, clock, machine = req.slot, self._clock, flight.machine
        ticket = self._queue.enter(slot)
        try:
            if ticket.ahead:
                flight.close()  # not held through a wait at the gate
                since = clock.now()
                async for queued in self._queued(ticket, slot, token):
                    yield queued
                flight.queued_s = clock.now() - since  # the slot was busy: charged to busy_wait_ms
            machine.happened(Input.SLOT_FREE)
            prediction, rendered = await self.cache.before(req, body, token, loaded=flight.loaded)
            machine.happened(Input.PREPARED)
            if prediction is not None:
                yield prediction
            while True:
                async for event in self._take_off(req, body, flight, token):
                    yield event
                exchange, stream = flight.flying()
                read = exchange.read
                now = clock.now
                consumed = flight.consumed
                cut = None
                while cut is None:  # the stream, read by read: the hot path
                    try:
                        data = await read(stream.timeout(now()))
                        if isinstance(data, TimedOut):
                            stream.silence(now())
                            continue
                    except (StreamClosedEarly, Stalled) as broke:
                        flight.consumed = consumed
                        cut = broke
                        break
                    consumed += len(data)
                    for step in stream.feed(data, now()):
                        if isinstance(step, PostReasoningEnd):
                            refusal = await self._post_reasoning_end(step.completion_id, token)
                            log.debug("reasoning_end posted: %s", "accepted" if refusal is None else "refused")
                            yield stream.control_answered(refusal)
                        elif isinstance(step, InferError):
                            if not isinstance(step, Stalled):  # an end without the final chunk: an unload?
                                raise await self._named(step, token) if isinstance(step, StreamClosedEarly) else step
                            flight.consumed, cut = consumed, step  # late bytes past the limit: a stall
                        elif isinstance(step, Completion):
                            machine.happened(Input.COMPLETED)
                            flight.landed()
                            self.cache.landed(req, body, rendered, prediction, step)
                            yield step
                            return
                        else:
                            if flight.first:
                                flight.first_token(step, now())
                            yield step
                async for retrying in self._after_cut(slot, flight, cut, token):
                    yield retrying
        finally:
            flight.close()
            if flight.sent and machine.phase is not Phase.DONE:  # the slot holds what we know not
                self.cache.forget(slot)
            try:  # the slot is given back however the stop ends; a cancel does not cut the stop
                if flight.generating is not None:
                    await AsyncUncut.run(self._stop, flight.generating)
            finally:
                self._queue.leave(ticket)

    async def _take_off(
        self, req: ChatRequest, body: bytes, flight: Flight, token: CancelToken
    ) -> AsyncGenerator[Waiting | Retrying, None]:
        """Until the flight has a connection to read: the request under a new id, its head
        awaited with a `/slots` poll each `poll_ms` (`Waiting`), or a re-attach; a break after
        the head a `Retrying` and its wait (before it, raised: the call re-sends). A refused
        re-attach re-sends at once, if the call may."""
        slot, now, machine = req.slot, self._clock.now, flight.machine
        while True:
            try:
                if flight.stream is None:  # a request, under a new id (one frame: no generator of its own)
                    conversation, exchange, stream, wait = await self._open(req, body, flight, token)
                    try:
                        while isinstance(head := await exchange.head(wait.timeout(now())), TimedOut):
                            decision = wait.on_poll(now(), await self.probe.state(slot, token))
                            token.raise_if_cancelled()
                            machine.happened(Input.POLLED)
                            yield decision.event
                            if decision.error is not None:
                                raise decision.error
                        if log.isEnabledFor(DEBUG):  # (its figures cost calls on the way to the first token)
                            log.debug("slot %d: response head %d after %.0f ms", slot, head.status, wait.age_ms(now()))
                        if head.status != 200:
                            flight.generating = None  # an error answer: nothing runs
                        await check_stream_head(exchange, head, self._clock, self._limits)
                    except BaseException:
                        exchange.close()
                        raise
                    stream.resumed(started := now())
                    flight.take_off(conversation, exchange, stream, started)
                    machine.happened(Input.HEAD)
                elif flight.exchange is None:  # a re-attach, from the bytes consumed
                    await self._reattach(flight, token)
                return
            except (StreamClosedEarly, Stalled, ConnectError) as broke:
                if flight.stream is None:
                    raise  # before the head: nothing to pick up (the call re-sends, if it may)
                async for retrying in self._after_cut(slot, flight, broke, token):
                    yield retrying
            except Refused:
                machine.name_cut(cut := await self._named(machine.refused_cut(), token))
                flight.forget_stream()
                event = machine.refused()  # the cut raised, if the call may not re-send
                if flight.generating is not None:  # a lost offset: it may still be running
                    await self._stop(flight.generating)
                log_resent_at_once(slot, event.attempt, cut)
                yield event

    async def _after_cut(
        self, slot: int, flight: Flight, broke: InferError, token: CancelToken
    ) -> AsyncGenerator[Retrying, None]:
        """A break after the head (a cut, a stall, a failed re-attach): a `Retrying`, its wait,
        then a re-attach; or raised, when the retry policy allows no more."""
        token.raise_if_cancelled()  # a cancel's own shutdown of the connection: no break, the call ends
        flight.close()
        machine, now = flight.machine, self._clock.now()
        taken = machine.cut_at(broke, now, flight.consumed)
        yield log_retry(slot, machine.attempts, taken, now, offset=flight.consumed)
        await self._clock.sleep(taken.after_s, token)
        token.raise_if_cancelled()
        machine.happened(taken.then)

    async def _open(
        self, req: ChatRequest, body: bytes, flight: Flight, token: CancelToken
    ) -> tuple[str, AsyncExchange, ChatStream, FirstByteWait]:
        """The request sent under a new id; its `ChatStream` and the wait for its head, made while it flies."""
        token.raise_if_cancelled()  # a close() that began while we queued: nothing is sent
        limits, conversation = self._limits, self._ids.take()
        headers, link = ((CONVERSATION_HEADER, conversation),), flight.take_link()
        open_chat = partial(self._transport.open, place_wait=limits.gate_wait_s)  # as for a slot
        exchange = await open_chat(
            "POST", CHAT_PATH, body, timeout=limits.poll_ms / 1000.0, cancel=token, headers=headers, link=link
        )
        flight.generating = conversation  # sent: the server may be generating for it from now on
        flight.sent = True
        flight.machine.happened(Input.SENT)
        try:
            self._ids.refill()  # the next request's id, made while this one's answer is awaited
            sent = self._clock.now()
            max_tokens = effective_max_tokens(req, self._settings)
            prompt = prompt_token_bound(len(body), self.info.n_ctx)
            budget = req.thinking and self._settings.thinking_budget is not None
            stream = ChatStream(limits.stream, max_tokens, sent, max_prompt_tokens=prompt, budget_sent=budget)
            wait = limits.first_byte_wait(sent, req.slot, flight.take_queued(), flight.take_charged())
            return conversation, exchange, stream, wait
        except BaseException:
            exchange.close()
            raise

    async def _reattach(self, flight: Flight, token: CancelToken) -> None:
        """The rest of the body from the bytes consumed, on a new connection; `Refused`: 404, 400."""
        assert flight.conversation is not None and flight.stream is not None
        offset, tail = flight.stream.replay(flight.consumed)  # `tail` read again, checked: the replay's start
        wait, path = self._limits.reattach_wait_s, reattach_path(flight.conversation, offset)
        exchange = await self._transport.open("GET", path, None, timeout=wait, cancel=token)
        try:
            head = await exchange.head(wait)
            if isinstance(head, TimedOut):
                raise Stalled(f"GET {STREAM_PATH}: no answer to the re-attach within {wait * 1000:.0f} ms")
            log.debug("re-attach from body byte %d: response head %d", offset, head.status)
            if head.status in REATTACH_REFUSED:
                raise Refused(head.status)
            if (later := reattach_later(head.status)) is not None:  # a break: re-attached again later
                raise later
            await check_stream_head(exchange, head, self._clock, self._limits)
        except BaseException:
            exchange.close()
            raise
        flight.picked_up(exchange, offset)
        flight.machine.happened(Input.PICKED_UP)
        flight.stream.resumed(self._clock.now(), tail)

    async def _named(self, cut: InferError, token: CancelToken) -> InferError:
        """A cut the server cannot mend, named for an unload when a router says so (`named_cut`)."""
        return await named_cut(self._transport, self._clock, self._limits.control(), self._settings.model, cut, token)

    async def _stop(self, conversation: str) -> None:
        """Stop the generation of `conversation` (closing its connection no longer does): a
        `DELETE` on a connection of its own, within `STOP_WAIT_S` (one for all those a close
        makes one after another), whatever the call's state."""
        await stop(self._transport, self._clock, stop_path(conversation), self._limits)

    async def _queued(self, ticket: Ticket, slot: int, token: CancelToken) -> AsyncGenerator[Queued, None]:
        """Wait at the gate for the slot, a `Queued` each time it moves up; `WaitTimeout` past `busy_wait_ms`."""
        queue, ahead = self._queue, ticket.ahead
        deadline = queue.deadline(self._limits.gate_wait_s)
        while ahead:
            log.debug("slot %d: queued, %d ahead", slot, ahead)
            yield Queued(ahead)
            moved = await queue.wait(ticket, token, deadline)
            if isinstance(moved, TimedOut):
                raise gate_timeout(slot, self._limits.busy_wait_ms)
            ahead = moved

    async def _post_reasoning_end(self, completion_id: str, token: CancelToken) -> str | None:
        """End the thinking block on a second connection: None if accepted, else why not."""
        body = build_control_body(completion_id, self._settings.model)
        return await post_control(self._transport, self._clock, body, self._limits.control(), token)

    # -- slot checkpoints ---------------------------------------------------------------------

    async def save_slot(self, slot: int, token: CancelToken) -> Checkpoint | None:
        """Save slot `slot`'s KV cache, the slot held at the gate (`AsyncPromptCache.save`)."""
        return await self._holding(slot, token, self.cache.save)

    async def restore_slot(self, slot: int, token: CancelToken) -> int:
        """Restore slot `slot`'s checkpoint, the slot held at the gate (`AsyncPromptCache.restore`)."""
        return await self._holding(slot, token, self.cache.restore)

    async def _holding(self, slot: int, token: CancelToken, work: Callable[[int, CancelToken], Awaitable[T]]) -> T:
        ticket = self._queue.enter(await self.info.check_slot(slot, token))
        try:
            async for _ in self._queued(ticket, slot, token):
                pass
            token.raise_if_cancelled()
            return await work(slot, token)
        finally:
            self._queue.leave(ticket)
