"""A small request whose answer is one body, and the `/slots` probe built on it: the I/O loops
over the `Exchange` port, written once (the blocking twin is generated from this file).

The rules are values in the domain (`domain.bodies`): the head within `head_wait_s` of sending;
then the body (or an error body) within `body_wait_s` more, in all, however it trickles in. A
200 answer's body is returned whole, or `ProtocolError` past `body_bytes`; any other status is
`HttpError(status, body)` with as much of the body as came within the deadline, up to
`error_body_bytes`. The connection is always closed before returning or raising.

`AsyncHttpSlotProbe` is the `AsyncSlotProbe` port over any transport: `GET /slots` on a
connection of its own under `ClientLimits.probe()`. A server that took the connection and then
sent no whole answer within those limits (`Stalled`: no head, or a body that stopped) is
`SlotState.UNRESPONSIVE`, logged as "no answer within N ms"; every other way of not learning the
state (refused, 503 while loading, 501 with `--no-slots`, a cut, a malformed or oversized body,
no entry for the slot) is `SlotState.UNAVAILABLE`, logged with `domain.errors.loggable`. Both at
WARNING under `inferpath.probe`, with no server text; only a negative slot id raises.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from domain.bodies import ErrorBody, FetchLimits, WholeBody, answered
from domain.errors import (
    HttpError,
    InferError,
    ModelNotLoaded,
    ProxyRefused,
    Stalled,
    http_error,
    loggable,
)
from domain.limits import ClientLimits
from domain.llama_api import (
    MODELS_PATH,
    SLOTS_PATH,
    not_a_stream,
    shown_target,
    slot_state,
    with_model,
)
from domain.router_api import model_state, refused_state
from ports.clock import AsyncClock
from ports.slot_probe import SlotState
from ports.transport import AsyncExchange, AsyncTransport, CancelSignal, ResponseHead

__all__ = [
    "AsyncHttpSlotProbe",
    "check_stream_head",
    "error_body",
    "fetch",
    "read_all",
    "refuse",
]

log = logging.getLogger("inferpath.probe")
client_log = logging.getLogger("inferpath.client")


async def fetch(
    transport: AsyncTransport,
    clock: AsyncClock,
    method: str,
    path: str,
    body: bytes | None,
    limits: FetchLimits,
    cancel: CancelSignal | None = None,
) -> bytes:
    """The body of a 200 answer to `method path`; see the module for the rule. `cancel` aborts
    the connection when the call is cancelled. A proxy's refusal reached no server: it is
    tried again once, after the proxy's refill time."""
    try:
        return await _fetch(transport, clock, method, path, body, limits, cancel)
    except ProxyRefused as refused:
        wait_s = refused.retry_after_s or 0.0
        client_log.info(
            "%s %s: refused by the proxy; tried again in %.0f ms",
            method,
            shown_target(path),
            wait_s * 1000,
        )
        await clock.sleep(wait_s, cancel)
        return await _fetch(transport, clock, method, path, body, limits, cancel)


async def _fetch(
    transport: AsyncTransport,
    clock: AsyncClock,
    method: str,
    path: str,
    body: bytes | None,
    limits: FetchLimits,
    cancel: CancelSignal | None,
) -> bytes:
    exchange = await transport.open(method, path, body, timeout=limits.head_wait_s, cancel=cancel)
    try:
        head = answered(await exchange.head(limits.head_wait_s), method, path, limits)
        deadline = clock.now() + limits.body_wait_s
        if head.status != 200:
            kept = await error_body(exchange, clock, deadline, limits.error_body_bytes)
            raise http_error(head.status, kept, limits.error_body_bytes)
        return await read_all(exchange, clock, limits.body_bytes, max(deadline - clock.now(), 0.0))
    finally:
        exchange.close()


async def check_stream_head(
    exchange: AsyncExchange, head: ResponseHead, clock: AsyncClock, limits: ClientLimits
) -> None:
    """A head that starts no event stream: `HttpError` with its body, or the whole answer's
    `ProtocolError`."""
    if head.status != 200:
        await refuse(exchange, head, clock, limits)
    refused = not_a_stream(head, exchange.what)
    if refused is not None:
        raise refused


async def refuse(
    exchange: AsyncExchange, head: ResponseHead, clock: AsyncClock, limits: ClientLimits
) -> NoReturn:
    """Raise the error a head that is not 200 says, with its body as far as it came within the
    liveness limit."""
    kept = await error_body(
        exchange, clock, clock.now() + limits.liveness_s, limits.error_body_bytes
    )
    raise http_error(head.status, kept, limits.error_body_bytes)


async def read_all(exchange: AsyncExchange, clock: AsyncClock, limit: int, timeout: float) -> bytes:
    """The body of `exchange`, whole, under `WholeBody`'s rule. Errors of `head` and `read` (a
    cut, malformed framing) pass through."""
    deadline = clock.now() + timeout
    body = WholeBody(exchange.what, limit, timeout)
    body.start(await exchange.head(timeout))
    while not body.take(await exchange.read(max(deadline - clock.now(), 0.0))):
        pass
    return body.data()


async def error_body(
    exchange: AsyncExchange, clock: AsyncClock, deadline: float, limit: int
) -> bytes:
    """Up to `limit` bytes of an error answer's body, as far as it came by `deadline`."""
    body = ErrorBody(limit, deadline)
    try:
        while (left := body.wait(clock.now())) is not None:
            if body.take(await exchange.read(left)):
                break
    except InferError:
        pass  # a body cut short still says what it can
    return body.data()


class AsyncHttpSlotProbe:
    """Works over any transport (a Unix socket in production, a script in tests). `model`, when
    given, is sent as `?model=` with `autoload=false`: a llama-server router routes GETs by it,
    and answers for a model it has not loaded at once (400) instead of loading it, which could
    evict another daemon's model; the probe then reads the model's status from `/models`. A
    single-model server ignores both."""

    __slots__ = ("_clock", "_limits", "_model", "_path", "_transport")

    def __init__(
        self,
        transport: AsyncTransport,
        clock: AsyncClock,
        limits: FetchLimits,
        model: str | None = None,
    ) -> None:
        self._transport = transport
        self._clock = clock
        self._limits = limits
        self._model = model
        self._path = SLOTS_PATH if model is None else with_model(SLOTS_PATH, model, autoload=False)

    async def state(self, slot: int, cancel: CancelSignal | None = None) -> SlotState:
        if slot < 0:
            raise ValueError(f"slot ids are never negative, got {slot}")
        clock = self._clock
        started = clock.now()
        try:
            body = await fetch(
                self._transport, clock, "GET", self._path, None, self._limits, cancel
            )
        except Stalled:
            # It took the connection and said nothing in time (paused, stuck in a decode).
            waited_ms = (clock.now() - started) * 1000
            log.warning(
                "slot %d: /slots probe: no answer within %.0f ms (unresponsive: paused or stuck)",
                slot,
                waited_ms,
            )
            return SlotState.UNRESPONSIVE
        except ModelNotLoaded:
            return await self._model_state(slot, cancel)
        except HttpError as exc:
            state = refused_state(exc)
            if state is SlotState.LOADING:
                log.warning(
                    "slot %d: /slots probe: the model is loading (HTTP %d)", slot, exc.status
                )
            else:
                log.warning("slot %d: /slots probe failed (%s)", slot, loggable(exc))
            return state
        except InferError as exc:
            # The server cannot say (refused, cut, malformed): the load budget runs.
            log.warning("slot %d: /slots probe failed (%s)", slot, loggable(exc))
            return SlotState.UNAVAILABLE
        state = slot_state(body, slot)
        if state is SlotState.UNAVAILABLE:
            log.warning("slot %d: /slots answer has no readable entry for this slot", slot)
        return state

    async def _model_state(self, slot: int, cancel: CancelSignal | None) -> SlotState:
        """A router that has not loaded the model: what its `/models` says it is doing."""
        if self._model is None:  # (a router answers "not loaded" only to a request that names one)
            return SlotState.UNAVAILABLE
        try:
            listing = await fetch(
                self._transport, self._clock, "GET", MODELS_PATH, None, self._limits, cancel
            )
        except InferError as exc:
            log.warning(
                "slot %d: the model is not loaded, and /models failed (%s)", slot, loggable(exc)
            )
            return SlotState.UNAVAILABLE
        state = model_state(listing, self._model)
        log.warning("slot %d: the model is not loaded: %s", slot, _SAID[state])
        return state


_SAID = {
    SlotState.LOADING: "the router is loading it",
    SlotState.ASLEEP: "it sleeps, and the request wakes it",
    SlotState.BEHIND: "the router runs another model's work first (waiting behind another model)",
    SlotState.UNAVAILABLE: "/models does not say what the router does with it",
}
