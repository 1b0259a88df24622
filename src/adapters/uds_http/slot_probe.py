"""The real `SlotProbe`: `GET /slots` on a connection of its own, within its own short timeout
(the head within `timeout`, the body within `timeout` more; `domain.fetch`'s rule).

Every way of not learning the state (refused, 503 while loading, 501 with `--no-slots`, silence,
a cut, a malformed or oversized body, no entry for the slot) is `SlotState.UNAVAILABLE`; only a
negative slot id, a caller's bug, raises. Each such failure is logged at WARNING with its reason
under `inferpath.probe`: the state says only "unavailable", the log says why.

`AsyncHttpSlotProbe` is the same probe for asyncio (`AsyncSlotProbe`), over an `AsyncTransport`;
cancelling the task that awaits it closes its connection and raises `asyncio.CancelledError`.
"""

from __future__ import annotations

import logging

from adapters.system import SystemClock
from domain.errors import ERROR_BODY_BYTES, InferError
from domain.fetch import FetchLimits, fetch, fetch_async
from domain.llama_api import SLOTS_PATH, slot_state, with_model
from ports.clock import Clock
from ports.slot_probe import SlotState
from ports.transport import AsyncTransport, CancelSignal, Transport

log = logging.getLogger("inferpath.probe")


class _SlotsRequest:
    """The probe's one request, the same for both probes: `GET /slots` (with `?model=` when
    given), the head and the body each within `timeout`."""

    __slots__ = ("clock", "limits", "path")

    def __init__(self, timeout: float, body_bytes: int, clock: Clock | None, model: str | None) -> None:
        self.path = SLOTS_PATH if model is None else with_model(SLOTS_PATH, model)
        self.limits = FetchLimits(timeout, timeout, body_bytes, ERROR_BODY_BYTES)
        self.clock: Clock = clock if clock is not None else SystemClock()


class HttpSlotProbe:
    """Works over any `Transport` (a Unix socket in production, a script in tests). `model`,
    when given, is sent as `?model=`: a llama-server router routes GETs by it (and loads that
    model if it was unloaded); a single-model server ignores it."""

    __slots__ = ("_request", "_transport")

    def __init__(
        self,
        transport: Transport,
        *,
        timeout: float,
        body_bytes: int,
        clock: Clock | None = None,
        model: str | None = None,
    ) -> None:
        self._transport = transport
        self._request = _SlotsRequest(timeout, body_bytes, clock, model)

    def state(self, slot: int, cancel: CancelSignal | None = None) -> SlotState:
        if slot < 0:
            raise ValueError(f"slot ids are never negative, got {slot}")
        r = self._request
        try:
            body = fetch(self._transport, r.clock, "GET", r.path, None, r.limits, cancel)
        except InferError as exc:
            return _failed(slot, exc)
        return _state_of(body, slot)


class AsyncHttpSlotProbe:
    """`HttpSlotProbe` over an `AsyncTransport`: the same request, limits, answers and log lines."""

    __slots__ = ("_request", "_transport")

    def __init__(
        self,
        transport: AsyncTransport,
        *,
        timeout: float,
        body_bytes: int,
        clock: Clock | None = None,
        model: str | None = None,
    ) -> None:
        self._transport = transport
        self._request = _SlotsRequest(timeout, body_bytes, clock, model)

    async def state(self, slot: int) -> SlotState:
        if slot < 0:
            raise ValueError(f"slot ids are never negative, got {slot}")
        r = self._request
        try:
            body = await fetch_async(self._transport, r.clock, "GET", r.path, None, r.limits)
        except InferError as exc:
            return _failed(slot, exc)
        return _state_of(body, slot)


def _failed(slot: int, exc: InferError) -> SlotState:
    # The server cannot say (refused, loading, silent, malformed): the load budget runs.
    log.warning("slot %d: /slots probe failed (%s: %s)", slot, type(exc).__name__, exc)
    return SlotState.UNAVAILABLE


def _state_of(body: bytes, slot: int) -> SlotState:
    state = slot_state(body, slot)
    if state is SlotState.UNAVAILABLE:
        log.warning("slot %d: /slots answer has no readable entry for this slot", slot)
    return state
