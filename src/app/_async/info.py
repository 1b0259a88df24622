"""The small calls that read the server (`/props`, `/slots`, `/tokenize`) and the rendering of a
chat body, each one request under `ClientLimits.info()`. Written once; the blocking twin
(`app/_sync/info.py`) is generated from this file by `scripts/unasync.py`.

The slot count and a slot's context are learned from `/props` on first need, when the config does
not pin them (`[expect]`), and kept.
"""

from __future__ import annotations

from app._async.fetch import fetch
from domain.cancel import CancelToken
from domain.errors import InferError
from domain.limits import ClientLimits
from domain.llama_api import (
    PROPS_PATH,
    SLOTS_PATH,
    TOKENIZE_PATH,
    Props,
    SlotInfo,
    Token,
    parse_props,
    parse_slots,
    parse_tokens,
    tokenize_body,
    with_model,
)
from domain.messages import ChatRequest
from domain.request import RequestSettings, build_chat_body, check_slot
from ports.clock import AsyncClock
from ports.transport import AsyncTransport, Link

__all__ = ["AsyncServerInfo"]


class AsyncServerInfo:
    """What the server says of itself, over the transport. Safe to share between calls."""

    def __init__(
        self,
        *,
        transport: AsyncTransport,
        clock: AsyncClock,
        request_settings: RequestSettings,
        limits: ClientLimits,
        total_slots: int | None,
        n_ctx: int | None,
    ) -> None:
        self._transport = transport
        self._clock = clock
        self._settings = request_settings
        self._limits = limits
        self._total_slots = total_slots
        self.n_ctx = n_ctx  # a slot's context, the bound of a prompt's progress; /props gives it too

    async def render(self, req: ChatRequest, token: CancelToken) -> bytes:
        """The exact request body `chat` sends for `req` (validated, deterministic): every check
        but the slot's bound is made before the slot count is asked of the server, if it must be."""
        body = build_chat_body(req, self._settings, total_slots=self._total_slots)
        if self._total_slots is None:
            check_slot(req.slot, await self.slot_count(token))
        return body

    async def props(self, token: CancelToken) -> Props:
        return parse_props(await self.get(PROPS_PATH, token))

    async def slots(self, token: CancelToken) -> list[SlotInfo]:
        return parse_slots(await self.get(SLOTS_PATH, token))

    async def tokenize(self, text: str, token: CancelToken) -> list[Token]:
        return parse_tokens(await self.post(TOKENIZE_PATH, tokenize_body(text, self._settings.model), token))

    async def check_slot(self, slot: int, token: CancelToken) -> int:
        """`slot`, or `RequestError` when it is not one of the server's slots (one that is no
        slot at all, before the slot count is asked of the server)."""
        checked = check_slot(slot, self._total_slots)
        return checked if self._total_slots is not None else check_slot(slot, await self.slot_count(token))

    async def get(self, path: str, token: CancelToken, *, quick: bool = False) -> bytes:
        """`GET path?model=...` under `ClientLimits.info()`, or `probe()` when `quick` (for what
        the server answers at once or not at all). A cancelled `token`: no connection is made."""
        token.raise_if_cancelled()
        path = with_model(path, self._settings.model)
        limits = self._limits.probe() if quick else self._limits.info()
        return await fetch(self._transport, self._clock, "GET", path, None, limits, token)

    async def post(self, path: str, body: bytes, token: CancelToken, *, quick: bool = False) -> bytes:
        token.raise_if_cancelled()  # no connection for a cancelled call
        limits = self._limits.probe() if quick else self._limits.info()
        return await fetch(self._transport, self._clock, "POST", path, body, limits, token)

    async def link_ahead(self, token: CancelToken) -> Link | None:
        """A connection for a chat whose body is about to be rendered, made first, so that the
        proxy's accept (and its connection upstream) runs while the body renders; None when
        `render` needs a request first (the slot count unknown) or the connect fails (the chat's
        own connect then says why)."""
        if self._total_slots is None:
            return None
        try:
            return await self._transport.connect(self._limits.poll_ms / 1000.0, token)
        except InferError:
            return None

    async def slot_count(self, token: CancelToken) -> int:
        if self._total_slots is None:
            token.raise_if_cancelled()
            props = await self.props(token)
            self._total_slots = props.total_slots
            if self.n_ctx is None:
                self.n_ctx = props.n_ctx
        return self._total_slots
