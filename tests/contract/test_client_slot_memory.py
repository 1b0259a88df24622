"""The blocking and the asyncio client of one container remember the slots together, as they
share the slot gate: a turn one completed is the turn the other's cache prediction starts from,
a checkpoint one saved is restored by the other after a restart, and what the server cannot do
(render a prompt, keep checkpoints) is learned, and warned of, once. Each test runs with either
flavour first, the other second."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from adapters.fake_server import FakeServer
from app.client import Client
from app.config import parse_config
from app.container import Container
from cache_server import ANSWER, CachingLlama
from client_support import ASYNC, LIMITS, RETRY, SYNC, Kind
from domain.events import CachePrediction, ChatEvent
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, SystemMessage, UserMessage

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

SYSTEM = SystemMessage("You are a terse assistant. " * 8)
ASK = UserMessage("What is the capital of France?")
NEXT = (SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))


def both(kind: Kind, server: FakeServer, *, predict: bool = True) -> tuple[Client, Client]:
    """The container's client of `kind`, then its client of the other flavour."""
    data: dict[str, Any] = {
        "socket": server.socket_path,
        "limits": {**LIMITS, "poll_ms": 1000},
        "retry": RETRY,
        "cache": {"predict": predict},
    }
    container = Container(config=parse_config(data))
    other = SYNC if kind.is_async else ASYNC
    return kind.client_of(container), other.client_of(container)


def turn(client: Client, *messages: ChatMessage) -> list[CachePrediction]:
    events: list[ChatEvent] = []
    client.chat(ChatRequest(slot=0, messages=messages), events.append)
    return [e for e in events if isinstance(e, CachePrediction)]


def paths(server: FakeServer) -> list[str]:
    return [f"{r.method} {r.target}" for r in server.requests]


def test_a_turn_one_flavour_completed_is_the_one_the_other_predicts_from(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server)
    first, second = both(client_kind, server)
    assert turn(first, SYSTEM, ASK) == []

    [prediction] = turn(second, *NEXT)

    assert prediction.reused == llama.cache_n[1] > 0  # exact, against the cache's own count
    assert not prediction.lost and prediction.cause is None


def test_a_checkpoint_one_flavour_saved_is_restored_by_the_other_after_a_restart(
    server: FakeServer, client_kind: Kind
) -> None:
    llama = CachingLlama(server)
    first, second = both(client_kind, server, predict=False)
    turn(first, SYSTEM, ASK)
    checkpoint = first.save_slot(0)
    assert checkpoint is not None
    llama.restart()

    [prediction] = turn(second, *NEXT)

    assert prediction.restored == checkpoint.tokens
    assert prediction.reused == llama.cache_n[1] > 0 and not prediction.lost
    assert "POST /slots/0?action=restore&autoload=false" in paths(server)


def test_restore_slot_in_the_other_flavour_finds_the_checkpoint(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server)
    first, second = both(client_kind, server)
    turn(first, SYSTEM, ASK)
    saved = llama.held[0]
    checkpoint = first.save_slot(0)
    assert checkpoint is not None
    llama.restart()
    assert second.restore_slot(0) == checkpoint.tokens and llama.held[0] == saved


def test_a_server_without_a_save_folder_is_asked_and_warned_of_once_for_both(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    CachingLlama(server, save_path=False)
    first, second = both(client_kind, server)
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        assert first.save_slot(0) is None
        assert second.save_slot(0) is None
    assert paths(server).count("POST /slots/0?action=save&autoload=false") == 1
    assert len([r for r in caplog.records if "--slot-save-path" in r.getMessage()]) == 1
