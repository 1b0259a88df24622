"""What the client logs: each request's life at DEBUG, what an operator must know at WARNING,
nothing by default, and never the text of a prompt or an answer."""

from __future__ import annotations

import logging

import pytest

from adapters.fake_server import FakeServer, json_reply, silence, sse_reply
from client_support import ANSWER, CHAT, REQ, SLOTS, Kind, chunk
from domain.errors import LoadTimeout
from domain.messages import ChatRequest, UserMessage

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

SECRET_PROMPT = "the launch code is 0000"
SECRET_ANSWER = "Paris is the answer"


def texts(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.name} {r.levelname} {r.getMessage()}" for r in caplog.records)


@pytest.mark.sync_only("builds no client")
def test_the_library_is_silent_unless_the_daemon_configures_logging() -> None:
    handlers = logging.getLogger("inferpath").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


def test_a_request_logs_its_life_at_debug_without_any_text(
    server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind
) -> None:
    answer = [ANSWER[0], chunk({"content": SECRET_ANSWER}, n=1), chunk(finish="stop", n=1)]
    server.route(*CHAT, sse_reply(answer))
    req = ChatRequest(slot=0, messages=(UserMessage(SECRET_PROMPT),))

    with caplog.at_level(logging.DEBUG, logger="inferpath"):
        client_kind.client_for(server).chat(req, lambda event: None)

    log = texts(caplog)
    assert "inferpath.client DEBUG slot 0: response head 200" in log
    assert "first token" in log
    assert "slot 0: stop, 42 prompt tokens (0 cached), 1 predicted" in log
    assert SECRET_PROMPT not in log and SECRET_ANSWER not in log
    assert all(r.name.startswith("inferpath") for r in caplog.records)


def test_a_retry_is_a_warning_naming_the_error(
    server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind
) -> None:
    answers = iter([json_reply({"error": {"code": 503, "message": "Loading model"}}, 503), sse_reply(ANSWER)])
    server.route(*CHAT, lambda request: next(answers))

    with caplog.at_level(logging.WARNING, logger="inferpath"):
        client_kind.client_for(server).chat_with_retry(REQ, lambda event: None)

    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "slot 0: re-send as attempt 2 in 50 ms after HttpError (HTTP 503)" in record.getMessage()


def test_a_failed_probe_is_a_warning_with_its_reason(
    server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind
) -> None:
    server.route(*CHAT, silence())
    server.route(*SLOTS, json_reply({"error": {"code": 503, "message": "Loading model"}}, 503))

    with caplog.at_level(logging.WARNING, logger="inferpath"), pytest.raises(LoadTimeout):
        client_kind.client_for(server, timed=True).chat(REQ, lambda event: None)

    probes = [r for r in caplog.records if r.name == "inferpath.probe"]
    assert probes, texts(caplog)
    assert "slot 0: /slots probe: the model is loading (HTTP 503)" in probes[0].getMessage()
    assert "Loading model" not in probes[0].getMessage(), "the server's text stays on the exception"
