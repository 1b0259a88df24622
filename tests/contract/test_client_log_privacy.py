"""No log record ever carries the server's text or the caller's: every DEBUG and WARNING path of a
call (queued, the head, polls and their failures, the first token, the control call, retries
after every retried error, the final timings and the cache outcome) is driven with a marker in
the prompt, in the answer, in every error body and in every malformed answer, and the marker
appears in no record: not its message, not its arguments, not a rendered exception.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.fake_server import End, FakeServer, json_reply, raw_reply, silence, sse_reply
from client_support import CHAT, CONTROL, SLOTS, Kind, chunk
from domain.errors import InferError
from domain.messages import ChatRequest, UserMessage

pytestmark = [pytest.mark.timeout(20), pytest.mark.usefixtures("client_kind")]

MARKER = "MARKER-4c1e9b"
REQ = ChatRequest(slot=0, messages=(UserMessage(f"the prompt holds {MARKER}"),), thinking=True)
ROLE = chunk({"role": "assistant", "content": None}, n=0, progress=(42, 0, 42))
ANSWER = [
    ROLE,
    chunk({"reasoning_content": f"thinking of {MARKER}"}, n=1),
    chunk({"reasoning_content": f"still {MARKER}"}, n=12),  # past the cap and the end tag's tokens
    chunk({"content": f"the answer is {MARKER}"}, n=13),
    chunk(finish="stop", n=13),
]
MARKED_ERROR = {"error": {"code": 503, "message": f"busy with {MARKER}", "type": "unavailable_error"}}


def leaks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every record that carries the marker anywhere, rendered in full."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    found = []
    for record in caplog.records:
        rendered = formatter.format(record)  # message, and the traceback of exc_info if any
        if MARKER in rendered or MARKER in repr(record.args) or MARKER in str(record.msg):
            found.append(rendered)
    return found


@contextlib.contextmanager
def everything_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with caplog.at_level(logging.DEBUG, logger="inferpath"):
        yield
    assert caplog.records, "the scenario logged nothing: it drove no path"


def run(client_kind: Kind, server: FakeServer, req: ChatRequest = REQ, **limits: Any) -> object:
    client = client_kind.client_for(server, timed=True, **limits)  # the scenarios end by their limits
    try:
        return client.chat_with_retry(req, lambda event: None)
    except InferError as exc:
        return exc


def test_a_whole_answer_with_polls_a_capped_thought_and_the_cache_logs_no_text(
    server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind
) -> None:
    # A busy poll (Waiting), a refused reasoning_end that quotes the marker, then the cache line
    # of a second turn on the same slot.
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True, "note": MARKER}]))
    server.route(*CHAT, sse_reply(ANSWER, head_delay_s=0.15), sse_reply(ANSWER))
    accepted = json_reply({"success": True, "note": MARKER})
    server.route(*CONTROL, accepted, accepted, json_reply({"success": False, "why": MARKER}))
    client = client_kind.client_for(server, thinking_cap=1, thinking_overrun=100, busy_wait_ms=2000, poll_ms=100)
    with everything_logged(caplog):
        for _ in range(2):
            client.chat(REQ, lambda event: None)
        with pytest.raises(InferError):  # the refused control call: ThinkingOverrun
            client.chat(REQ, lambda event: None)
    messages = [r.getMessage() for r in caplog.records]
    assert "reasoning_end posted: accepted" in messages
    assert "reasoning_end posted: refused" in messages
    assert any("against the request before it" in m for m in messages)
    assert leaks(caplog) == []


@pytest.mark.parametrize(
    ("first", "retry"),
    [
        pytest.param(json_reply(MARKED_ERROR, 503), "re-send", id="a 503 error body"),
        pytest.param(sse_reply([ROLE, {"error": MARKED_ERROR["error"]}]), "re-send", id="an error event in the stream"),
        pytest.param(
            sse_reply([ROLE, chunk({"content": MARKER}, n=1)], done=False), "re-send", id="a stream cut short"
        ),
        pytest.param(
            sse_reply([ROLE, chunk({"content": MARKER}, n=1)], done=False, end=End.SILENCE),
            "re-attach at body byte",
            id="a stream that stalls",
        ),
    ],
)
def test_every_retried_error_is_logged_without_its_text(
    server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind, first: Any, retry: str
) -> None:
    server.route(*CHAT, first, sse_reply(ANSWER))
    with everything_logged(caplog):
        outcome = run(client_kind, server)
    assert not isinstance(outcome, InferError), outcome
    assert any(re.match(rf"slot 0: {retry}( \d+)? as attempt 2 ", r.getMessage()) for r in caplog.records)
    assert leaks(caplog) == []


@pytest.mark.parametrize(
    "slots",
    [
        pytest.param(json_reply(MARKED_ERROR, 503), id="a 503 error body"),
        pytest.param(raw_reply(f"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n[{MARKER}".encode()), id="malformed"),
        pytest.param(json_reply([{"id": MARKER, "is_processing": True}]), id="no readable entry"),
    ],
)
def test_a_failed_probe_is_logged_without_the_servers_text(
    server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind, slots: Any
) -> None:
    server.route(*SLOTS, slots)
    server.route(*CHAT, silence())
    with everything_logged(caplog):
        run(client_kind, server)
    assert any("/slots" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert leaks(caplog) == []


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(json_reply({"error": {"code": 400, "message": MARKER}}, 400), id="a 400 error body"),
        pytest.param(sse_reply([ROLE, f"{{not json {MARKER}"]), id="a malformed chunk"),
        pytest.param(
            raw_reply(f"HTTP/1.1 200 OK\r\nContent-Type: text/{MARKER}\r\nContent-Length: 0\r\n\r\n".encode()),
            id="a whole answer where a stream was asked for",
        ),
    ],
)
def test_an_error_that_is_not_retried_is_logged_without_its_text(
    server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind, answer: Any
) -> None:
    server.route(*CHAT, answer)
    with everything_logged(caplog):
        outcome = run(client_kind, server)
    assert isinstance(outcome, InferError)
    assert MARKER in str(outcome) or MARKER in getattr(outcome, "body", ""), "the caller still gets the text"
    assert leaks(caplog) == []


def test_queued_calls_log_no_text(server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind) -> None:
    release = threading.Event()
    server.route(*CHAT, sse_reply(ANSWER, head_delay_s=0.2), sse_reply(ANSWER))
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": True}]))
    client = client_kind.client_for(server, busy_wait_ms=3000, liveness_ms=2000, poll_ms=100)
    outcomes: list[object] = []

    def call() -> None:
        try:
            outcomes.append(client.chat(REQ, lambda event: release.set()))
        except InferError as exc:
            outcomes.append(exc)

    with everything_logged(caplog):
        first = threading.Thread(target=call)
        first.start()
        second = threading.Thread(target=call)
        second.start()
        first.join(5.0)
        second.join(5.0)
    assert len(outcomes) == 2
    assert not any(isinstance(o, InferError) for o in outcomes), outcomes
    assert any("queued" in r.getMessage() for r in caplog.records)
    assert leaks(caplog) == []
