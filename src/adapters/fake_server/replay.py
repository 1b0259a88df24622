"""llama-server's replay ring, played by the fake server: a chat stream kept per conversation
id, so that a client can re-attach to it after a cut.

    ring = ReplayRing(events, cut_after=2048)        # the SSE events of the whole answer
    server.route("POST", "/v1/chat/completions", ring.chat)
    server.route("GET", "/v1/stream", ring.reattach)
    server.route("DELETE", "/v1/stream", ring.stop)

What the real server does (its `server-stream.cpp`): a `POST` with `X-Conversation-Id` keeps the
de-chunked response body under that id; `GET /v1/stream?conv_id=ID&from=N` answers 200 with the
body from byte N, 404 for an id it does not know, 400 for an offset it no longer holds; `DELETE`
answers 204 and forgets the id. Here the first `POST` is cut after `cut_after` body bytes (`cut`
says how; later requests are not cut), each re-attach is answered from the whole body (cut again
after `reattach_cut` bytes if that is set; from `skew` bytes off its `from`, a faulty server, if
that is set), `forget()` plays a server restart, and `dropped` the bytes that fell out of the ring.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from adapters.fake_server.script import (
    SSE_HEADERS,
    End,
    Piece,
    RecordedRequest,
    Reply,
    error_reply,
    sse_event,
)

__all__ = ["ReplayRing"]


class ReplayRing:
    def __init__(
        self,
        events: Iterable[Mapping[str, Any] | str | bytes],
        *,
        cut_after: int | None = None,
        cut: End = End.RESET,
        reattach_cut: int | None = None,
        delay_s: float = 0.0,
        done: bool = True,
        skew: int = 0,
    ) -> None:
        pieces = [sse_event(e) for e in events]
        if done:
            pieces.append(b"data: [DONE]\n\n")
        self.pieces = pieces
        self.body = b"".join(pieces)
        self.cut_after = cut_after
        self.cut = cut
        self.reattach_cut = reattach_cut
        self.skew = skew  # a faulty server: each re-attach answered from `from` + skew
        self.delay_s = delay_s
        self.dropped = 0
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self.conversations: list[str] = []  # every id a POST carried, in order
        self.offsets: list[int] = []  # every re-attach's `from`, in order
        self.stopped: list[str] = []  # every id a DELETE named, in order

    def forget(self) -> None:
        """The server restarted: every conversation is gone."""
        with self._lock:
            self._known.clear()

    def chat(self, request: RecordedRequest) -> Reply:
        conversation = request.header("x-conversation-id")
        with self._lock:
            first = not self.conversations
            if conversation is not None:
                self.conversations.append(conversation)
                self._known.add(conversation)
        limit = self.cut_after if first else None
        return self._reply(0, limit)

    def reattach(self, request: RecordedRequest) -> Reply:
        query = parse_qs(urlsplit(request.target).query)
        conversation = query.get("conv_id", [""])[0]
        try:
            offset = int(query.get("from", ["0"])[0])
        except ValueError:
            return error_reply(400, "Invalid 'from' offset", "invalid_request_error")
        with self._lock:
            self.offsets.append(offset)
            known = conversation in self._known
        if not known:
            return error_reply(404, "Stream not found or expired", "not_found_error")
        if offset < self.dropped or offset > len(self.body):
            return error_reply(400, "Stream offset lost, please restart", "invalid_request_error")
        return self._reply(min(max(offset + self.skew, 0), len(self.body)), self.reattach_cut)

    def stop(self, request: RecordedRequest) -> Reply:
        conversation = parse_qs(urlsplit(request.target).query).get("conv_id", [""])[0]
        with self._lock:
            self.stopped.append(conversation)
            self._known.discard(conversation)
        return Reply(204, SSE_HEADERS[:2])

    def _reply(self, offset: int, limit: int | None) -> Reply:
        """The body from `offset` in the chunks the server wrote it in (the first cut at the
        offset), cut after `limit` bytes if that is set."""
        out: list[Piece] = []
        at = 0
        sent = 0
        for piece in self.pieces:
            start, end = at, at + len(piece)
            at = end
            if end <= offset:
                continue
            data = piece[max(offset - start, 0) :]
            if limit is not None and sent + len(data) > limit:
                data = data[: limit - sent]
                if data:
                    out.append(Piece(self.delay_s, data))
                return Reply(200, SSE_HEADERS, out, end=self.cut, chunked=True)
            out.append(Piece(self.delay_s, data))
            sent += len(data)
        return Reply(200, SSE_HEADERS, out, chunked=True)
