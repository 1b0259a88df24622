"""Conversation ids: the key to a chat's replay on the server (`X-Conversation-Id`), so fresh
and secret; made ahead of the request that sends one."""

from __future__ import annotations

import os

__all__ = ["ConversationIds", "new_conversation_id"]


def new_conversation_id() -> str:
    """A fresh conversation id: 128 random bits, since anyone who knows it can read the replay."""
    return os.urandom(16).hex()  # as `secrets.token_hex(16)` makes it, in fewer steps


class ConversationIds:
    """Fresh conversation ids, each made ahead: just after a request is out (`refill`), while
    its answer is awaited, rather than on the way to the next request's first byte (where the
    random bytes' system call costs tens of µs once the process has sat idle). Never one id
    twice: `take` pops it (atomic, so threads may share this), and an id made in another process
    (before a fork) is never taken."""

    __slots__ = ("_ready",)

    def __init__(self) -> None:
        self._ready: list[tuple[int, str]] = []  # (the process that made it, the id)

    def take(self) -> str:
        """The id made ahead, or a new one."""
        try:
            pid, conversation = self._ready.pop()
        except IndexError:
            return new_conversation_id()
        return conversation if pid == os.getpid() else new_conversation_id()

    def refill(self) -> None:
        """Make the next id, if none is waiting."""
        if not self._ready:
            self._ready.append((os.getpid(), new_conversation_id()))
