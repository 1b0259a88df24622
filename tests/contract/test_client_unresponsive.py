"""A wedged server named as such, over both clients: one that takes connections and answers
nothing (paused with SIGSTOP, stuck in a decode) ends the wait in `LoadTimeout` within the load
budget, and the message, the `Waiting` events and the probe's log lines say it was unresponsive,
not loading or refused.

The client's limits are `client_support`'s (polls every 100 ms; the probe's own timeout is the
poll, 100 ms), with a 250 ms load budget. A poll is due 100 ms after the one before began, and a
probe that hears nothing takes those 100 ms itself, so polls begin at 100, 200 and 300 ms, each
charging 100 ms: the third reaches the budget (halfway between two polls, so a poll up to 50 ms
late changes no count) and the wait ends when its probe does, at about 400 ms.
"""

from __future__ import annotations

import logging
import re
import time

import pytest

from adapters.fake_server import FakeServer, loading, silence
from client_support import CHAT, REQ, SLOTS, Kind, recorded
from domain.errors import LoadTimeout
from domain.events import ChatEvent, ModelWait, Waiting

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

UNRESPONSIVE_TIMEOUT = re.compile(
    r"slot 0: the server accepted connections but answered nothing for (\d+) ms \(unresponsive: paused or stuck\), "
    r"unavailable for 0 ms; limit 250 ms for the two together; no data (\d+) ms after sending, 3 polls"
)


def test_a_server_that_answers_nothing_is_a_load_timeout_that_says_unresponsive(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    server.route(*SLOTS, silence())
    server.route(*CHAT, silence())
    events: list[ChatEvent] = []
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="inferpath.probe"), pytest.raises(LoadTimeout) as caught:
        client_kind.client_for(server, timed=True, load_wait_ms=250).chat(REQ, events.append)

    elapsed = time.monotonic() - started
    assert events == [Waiting(slot_busy=False, unresponsive=True)] * 3
    matched = UNRESPONSIVE_TIMEOUT.fullmatch(str(caught.value))
    assert matched is not None, str(caught.value)
    silent_ms, waited_ms = (int(group) for group in matched.groups())
    assert silent_ms == waited_ms >= 300, "every poll's time was charged as unresponsive"
    assert 0.4 <= elapsed < 2.0
    probe_lines = [r.getMessage() for r in caplog.records if r.name == "inferpath.probe"]
    assert len(probe_lines) == 3
    assert all(
        re.fullmatch(r"slot 0: /slots probe: no answer within \d+ ms \(unresponsive: paused or stuck\)", line)
        for line in probe_lines
    ), probe_lines
    (request,) = recorded(server, CHAT)
    assert request.client_closed.wait(2.0), "the chat's connection is closed"
    assert all(r.client_closed.wait(2.0) for r in recorded(server, SLOTS)), "so is every probe's"


def test_a_server_that_says_it_is_loading_is_not_called_unresponsive(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    server.route(*SLOTS, loading())
    server.route(*CHAT, silence())
    events: list[ChatEvent] = []

    with caplog.at_level(logging.WARNING, logger="inferpath.probe"), pytest.raises(LoadTimeout) as caught:
        client_kind.client_for(server, timed=True).chat(REQ, events.append)

    assert events == [Waiting(slot_busy=False, unresponsive=False, model=ModelWait.LOADING)] * 2
    assert "the model was loading for" in str(caught.value)
    assert "unresponsive" not in str(caught.value)
    probe_lines = [r.getMessage() for r in caplog.records if r.name == "inferpath.probe"]
    assert probe_lines == ["slot 0: /slots probe: the model is loading (HTTP 503)"] * 2
