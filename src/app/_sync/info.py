# Generated from src/app/_async/info.py by scripts/unasync.py: do not edit.
"""The small calls that read the server (`/props`, `/slots`, `/tokenize`) and the rendering of a
chat body, each one request under `ClientLimits.info()`. Written once; the blocking twin
(`app/_sync/info.py`) is generated from this file by `scripts/unasync.py`.

The slot count and a slot's context are learned from `/props` on first need, when the config does
not pin them (`[expect]`), and kept.

None of them loads a model on a llama-server router: a GET carries `autoload=false` beside its
`?model=`, a POST `?autoload=false`, and a router that has not loaded the model answers
`ModelNotLoaded` at once (loading it could evict another daemon's model under `--models-max`).
Only `props(load=True)` loads it (the self-test and `--print-expect`), and a chat
(`app._sync.call`), which waits for the load with events.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Generator

from app._sync.fetch import fetch, read_all, refuse
from domain.attempt import AttemptMachine
from domain.cancel import CancelToken
from domain.errors import InferError
from domain.events import Waiting
from domain.limits import ClientLimits
from domain.llama_api import (
    PROPS_PATH,
    SLOTS_PATH,
    TOKENIZE_PATH,
    Props,
    SlotInfo,
    Token,
    no_autoload,
    parse_props,
    parse_slots,
    parse_tokens,
    tokenize_body,
    with_model,
)
from domain.messages import ChatRequest
from domain.request import RequestSettings, build_chat_body, check_slot
from ports.clock import Clock
from ports.slot_probe import SlotProbe
from ports.transport import Transport, Link, TimedOut

__all__ = ["ServerInfo"]

log = logging.getLogger("inferpath.client")


class ServerInfo:
    """What the server says of itself, over the transport. Safe to share between calls."""

    def __init__(
        self,
        *,
        transport: Transport,
        clock: Clock,
        request_settings: RequestSettings,
        limits: ClientLimits,
        total_slots: int | None,
        n_ctx: int | None,
    ) -> None:
        self._transport = transport
        self._clock = clock
        self.clock = clock  # what the prompt cache times its saves and restores by
        self._settings = request_settings
        self._limits = limits
        self._total_slots = total_slots
        self.n_ctx = (
            n_ctx  # a slot's context, the bound of a prompt's progress; /props gives it too
        )

    def render(self, req: ChatRequest, token: CancelToken) -> bytes:
        """The exact request body `chat` sends for `req` (validated, deterministic): every check
        but the slot's bound is made before the slot count is asked of the server, if it must be."""
        body = build_chat_body(req, self._settings, total_slots=self._total_slots)
        if self._total_slots is None:
            check_slot(req.slot, self.slot_count(token))
        return body

    def props(self, token: CancelToken, *, load: bool = False, quick: bool = False) -> Props:
        """`/props` of the config's model; `load`: a router loads it if it is not (under the
        info limits: the head within `load_wait_ms`), else `ModelNotLoaded`; `quick`: as `get`'s."""
        return self.learned(parse_props(self.get(PROPS_PATH, token, quick=quick, load=load)))

    def learned(self, props: Props) -> Props:
        """Keep what `props` says of the slots, where the config did not pin it."""
        if self._total_slots is None:
            self._total_slots = props.total_slots
        if self.n_ctx is None:
            self.n_ctx = props.n_ctx
        return props

    def slots(self, token: CancelToken) -> list[SlotInfo]:
        return parse_slots(self.get(SLOTS_PATH, token))

    def tokenize(self, text: str, token: CancelToken) -> list[Token]:
        return parse_tokens(
            self.post(TOKENIZE_PATH, tokenize_body(text, self._settings.model), token)
        )

    def check_slot(self, slot: int, token: CancelToken) -> int:
        """`slot`, or `RequestError` when it is not one of the server's slots (one that is no
        slot at all, before the slot count is asked of the server)."""
        checked = check_slot(slot, self._total_slots)
        return (
            checked
            if self._total_slots is not None
            else check_slot(slot, self.slot_count(token))
        )

    def get(
        self, path: str, token: CancelToken, *, quick: bool = False, load: bool = False
    ) -> bytes:
        """`GET path?model=...` under `ClientLimits.info()`, or `probe()` when `quick` (for what
        the server answers at once or not at all); with `autoload=false` unless `load`. A
        cancelled `token`: no connection is made."""
        token.raise_if_cancelled()
        path = with_model(path, self._settings.model, autoload=load)
        limits = self._limits.probe() if quick else self._limits.info()
        return fetch(self._transport, self._clock, "GET", path, None, limits, token)

    def post(
        self,
        path: str,
        body: bytes,
        token: CancelToken,
        *,
        quick: bool = False,
        within: float | None = None,
    ) -> bytes:
        """`POST path?autoload=false` (`body` names the model); limits as `get`'s, or the head
        `within` seconds and the body under the probe's limit (for work a turn waits for)."""
        token.raise_if_cancelled()  # no connection for a cancelled call
        limits = self._limits.probe() if quick or within is not None else self._limits.info()
        if within is not None:
            limits = dataclasses.replace(limits, head_wait_s=within)
        return fetch(
            self._transport, self._clock, "POST", no_autoload(path), body, limits, token
        )

    def link_ahead(self, token: CancelToken) -> Link | None:
        """A connection for a chat whose body is rendered and will be sent at once, made first,
        so that the proxy's accept (and its connection upstream) runs while the call sets out;
        None when the slot count is unknown (a request for it goes first) or the connect fails
        (the chat's own connect then says why)."""
        if self._total_slots is None:
            return None
        try:
            return self._transport.connect(self._limits.poll_s, token)
        except InferError:
            return None

    def load(
        self, probe: SlotProbe, machine: AttemptMachine, token: CancelToken
    ) -> Generator[Waiting, None, None]:
        """Have a router load the model for a chat about to be sent on the machine's slot, and
        learn its `/props`: a `GET /props` that loads it, its head awaited with a `probe` each
        `poll_ms` (`Waiting`: loading, or behind another model's work) under the chat's own
        budgets, charged by the machine (`AttemptMachine.load_wait`). A model already loaded
        answers at once."""
        limits, clock, now, slot = self._limits, self._clock, self._clock.now, machine.slot
        token.raise_if_cancelled()
        path = with_model(PROPS_PATH, self._settings.model)
        transport = self._transport
        exchange = transport.open("GET", path, None, timeout=limits.poll_s, cancel=token)
        try:
            wait = machine.load_wait(now())
            log.debug("slot %d: the model is not loaded: waiting for the router to load it", slot)
            while isinstance(head := exchange.head(wait.timeout(now())), TimedOut):
                decision = machine.polled(now(), probe.state(slot, token))
                token.raise_if_cancelled()
                yield decision.event
                if decision.error is not None:
                    raise decision.error
            if head.status != 200:
                refuse(exchange, head, clock, limits)
            raw = read_all(exchange, clock, limits.body_bytes, limits.liveness_s)
        finally:
            exchange.close()
        self.learned(parse_props(raw))
        log.debug(
            "slot %d: the model is loaded, %.0f ms after it was asked for", slot, wait.age_ms(now())
        )

    def slot_count(self, token: CancelToken) -> int:
        """The server's slot count; `ModelNotLoaded` from a router that has not loaded the model."""
        if self._total_slots is None:
            token.raise_if_cancelled()
            return (self.props(token)).total_slots
        return self._total_slots
