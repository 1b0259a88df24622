"""The real `SlotProbe`: `GET /slots` on a connection of its own, within its own short timeout.

Every way of not learning the state (refused, 503 while loading, 501 with `--no-slots`, silence,
a cut, a malformed or oversized body, no entry for the slot) is `SlotState.UNAVAILABLE`; only a
negative slot id, a caller's bug, raises.
"""

from __future__ import annotations

from adapters.system import SystemClock
from domain.errors import InferError
from domain.llama_api import SLOTS_PATH, slot_state, with_model
from domain.whole_body import read_all
from ports.clock import Clock
from ports.slot_probe import SlotState
from ports.transport import TimedOut, Transport


class UdsSlotProbe:
    """`model`, when given, is sent as `?model=`: a llama-server router routes GETs by it (and
    loads that model if it was unloaded); a single-model server ignores it."""

    __slots__ = ("_body_bytes", "_clock", "_path", "_timeout", "_transport")

    def __init__(
        self,
        transport: Transport,
        *,
        timeout: float,
        body_bytes: int,
        clock: Clock | None = None,
        model: str | None = None,
    ) -> None:
        self._path = SLOTS_PATH if model is None else with_model(SLOTS_PATH, model)
        self._transport = transport
        self._timeout = timeout
        self._body_bytes = body_bytes
        self._clock: Clock = clock if clock is not None else SystemClock()

    def state(self, slot: int) -> SlotState:
        if slot < 0:
            raise ValueError(f"slot ids are never negative, got {slot}")
        body = self._fetch()
        if body is None:
            return SlotState.UNAVAILABLE
        return slot_state(body, slot)

    def _fetch(self) -> bytes | None:
        clock = self._clock
        deadline = clock.now() + self._timeout
        try:
            exchange = self._transport.open("GET", self._path, timeout=self._timeout)
        except InferError:
            return None
        try:
            head = exchange.head(max(deadline - clock.now(), 0.0))
            if isinstance(head, TimedOut) or head.status != 200:
                return None
            return read_all(exchange, clock, self._body_bytes, max(deadline - clock.now(), 0.0))
        except InferError:
            return None
        finally:
            exchange.close()
