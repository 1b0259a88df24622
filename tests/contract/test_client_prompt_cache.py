"""The cache prediction and the slot checkpoints through a whole client, both flavours, against a
fake server whose prompt cache behaves as llama-server's (`tests/cache_server.py`): each
prediction is checked against the `cache_n` that cache then reports."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from adapters.fake_server import (
    ROLE,
    End,
    FakeServer,
    RecordedRequest,
    Reply,
    chunk,
    error_reply,
    json_reply,
    silence,
    sse_reply,
)
from app.client import Client
from app.config import parse_config
from app.container import Container
from cache_server import ANSWER, CachingLlama, render
from client_support import LIMITS, NO_PROXY_LIMIT, RETRY, Kind
from domain.cancel import CancelToken
from domain.errors import Cancelled, ClientClosed, LoadTimeout, RequestError, StreamClosedEarly
from domain.events import CacheCause, CachePrediction, ChatEvent, Content
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, SystemMessage, UserMessage

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

SYSTEM = SystemMessage("You are a terse assistant. " * 8)
ASK = UserMessage("What is the capital of France?")
LONG_REASONING = "The user asks for a capital. France's capital is Paris, as every atlas says. " * 2


def client_for(
    kind: Kind,
    server: FakeServer,
    *,
    predict: bool = True,
    poll_ms: int = 1000,
    **limits: int,
) -> Client:
    """A client whose prediction requests may take up to `poll_ms` (the probe's limit), with
    the other `limits` changed."""
    data: dict[str, Any] = {
        "proxy": NO_PROXY_LIMIT,
        "socket": server.socket_path,
        "limits": {**LIMITS, "poll_ms": poll_ms, **limits},
        "retry": RETRY,
        "cache": {"predict": predict},
    }
    return kind.client_of(Container(config=parse_config(data)))


def turn(client: Client, *messages: ChatMessage, slot: int = 0, thinking: bool = False) -> list[ChatEvent]:
    events: list[ChatEvent] = []
    client.chat(ChatRequest(slot=slot, messages=messages, thinking=thinking), events.append)
    return events


def predictions(events: list[ChatEvent]) -> list[CachePrediction]:
    return [e for e in events if isinstance(e, CachePrediction)]


def paths(server: FakeServer) -> list[str]:
    return [f"{r.method} {r.target}" for r in server.requests]


def test_a_turn_that_extends_the_last_one_is_predicted_before_it_is_sent(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server)
    client = client_for(client_kind, server)
    assert predictions(turn(client, SYSTEM, ASK)) == []  # nothing ran on the slot before
    del server.requests[:]

    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))

    [prediction] = predictions(events)
    assert events.index(prediction) < events.index(Content(ANSWER))
    assert prediction.reused == llama.cache_n[1]  # exact, against the cache's own count
    assert not prediction.lost and prediction.cause is None
    assert paths(server)[:3] == [
        "POST /apply-template?autoload=false",
        "POST /tokenize?autoload=false",
        "GET /slots?model=default&autoload=false",
    ]
    assert server.requests[1].json() == {"content": render(server.requests[3].json()), "model": "default"}
    assert paths(server)[3] == "POST /v1/chat/completions"


def test_a_changed_system_prompt_is_predicted_as_a_loss_at_message_0(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)

    [prediction] = predictions(turn(client, SystemMessage("Be verbose."), ASK, AssistantMessage(ANSWER)))

    assert prediction.reused == llama.cache_n[1]
    assert (prediction.lost, prediction.message, prediction.cause) == (True, 0, CacheCause.MESSAGE_CHANGED)


def test_reasoning_the_template_drops_is_predicted_and_named(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server, reasoning=LONG_REASONING)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK, thinking=True)

    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"), thinking=True)

    [prediction] = predictions(events)
    assert prediction.reused == llama.cache_n[1]
    assert (prediction.lost, prediction.message, prediction.cause) == (True, 2, CacheCause.REASONING_DROPPED)


def test_a_slot_emptied_by_another_slots_task_is_predicted(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server, unified=True)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    turn(client, UserMessage("Hi"), slot=1)

    [prediction] = predictions(turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?")))

    assert prediction.reused == llama.cache_n[2] == 0
    assert (prediction.lost, prediction.message, prediction.cause) == (True, None, CacheCause.SLOT_EMPTIED)


def test_without_the_switch_nothing_is_predicted_and_nothing_more_is_asked(
    server: FakeServer, client_kind: Kind
) -> None:
    CachingLlama(server)
    client = client_for(client_kind, server, predict=False)
    turn(client, SYSTEM, ASK)
    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))
    assert predictions(events) == []
    assert [p for p in paths(server) if not p.startswith("GET /props")] == ["POST /v1/chat/completions"] * 2


def test_a_server_that_cannot_render_turns_the_prediction_off_with_one_warning(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    CachingLlama(server)
    server.route("POST", "/apply-template", error_reply(404, "File Not Found", "not_found_error"))
    client = client_for(client_kind, server)
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        for _ in range(3):
            events = turn(client, SYSTEM, ASK)
            assert Content(ANSWER) in events and predictions(events) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["cache prediction off: the server cannot render a prompt (HTTP 404)"]
    assert paths(server).count("POST /apply-template?autoload=false") == 1


def test_a_prediction_that_fails_for_one_turn_never_fails_the_turn(server: FakeServer, client_kind: Kind) -> None:
    CachingLlama(server)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    server.route("GET", "/slots", error_reply(500, "boom"))
    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))
    assert Content(ANSWER) in events and predictions(events) == []


def test_a_server_wedged_at_the_restore_ends_the_turn_within_the_turns_own_wait(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    # The server answers the prediction, then nothing: not the restore, the chat or a probe. The
    # restore may wait what the turn's `load_wait_ms` has left, and the head wait charges that
    # time too: the turn ends on its one budget, not on a whole `load_wait_ms` spent on the
    # restore before a whole one of its own.
    _, client = saved_then_restarted(server, client_kind, poll_ms=100, load_wait_ms=300)
    emptied = [{"id": i, "is_processing": False, "n_prompt_tokens": 0} for i in (0, 1)]
    server.route("GET", "/slots", json_reply(emptied), silence())
    server.route("POST", "/slots/0", silence())
    server.route("POST", "/v1/chat/completions", silence())
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="inferpath"), pytest.raises(LoadTimeout):
        turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))
    elapsed = time.monotonic() - started
    assert any("not restored: Stalled" in r.getMessage() for r in caplog.records), caplog.text
    # 300 ms from the slot taken, and the probe that finds it spent (100 ms): about 0.4 s;
    # two whole waits of 300 ms and more before
    assert elapsed < 0.6, elapsed


def test_a_restore_slower_than_a_probe_is_waited_for(server: FakeServer, client_kind: Kind) -> None:
    # A restore reads the checkpoint into the slot: it may take longer than the prediction's
    # short requests may (100 ms here), and gets what the turn's wait has left for it.
    llama = CachingLlama(server)
    client = client_for(client_kind, server, poll_ms=100)
    turn(client, SYSTEM, ASK)
    checkpoint = client.save_slot(0)
    assert checkpoint is not None
    llama.restart()
    restored = {"filename": checkpoint.filename, "n_restored": checkpoint.tokens, "n_read": 1}
    server.route("POST", "/slots/0", json_reply({"id_slot": 0, **restored}, head_delay_s=0.3))

    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))

    [prediction] = predictions(events)

    assert prediction.restored == checkpoint.tokens


@pytest.mark.parametrize("status", [404, 501])
def test_a_slots_answer_of_404_or_501_skips_one_turn_and_turns_nothing_off(
    server: FakeServer, client_kind: Kind, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Only a failed rendering (/apply-template, /tokenize) says the server cannot render: a
    # /slots it does not serve (--no-slots) costs this turn's prediction, not every later one.
    llama = CachingLlama(server)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    server.route("GET", "/slots", error_reply(status, "gone"))
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))
    assert Content(ANSWER) in events and predictions(events) == []
    assert not [r for r in caplog.records if "prediction off" in r.getMessage()]
    server.route("GET", "/slots", lambda r: json_reply(llama._slots()))
    del server.requests[:]
    later = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Italy?"))
    assert len(predictions(later)) == 1, "the next turn is predicted again"
    # with the last turn's rendering kept: three small requests, as every turn
    assert paths(server)[:3] == [
        "POST /apply-template?autoload=false",
        "POST /tokenize?autoload=false",
        "GET /slots?model=default&autoload=false",
    ]


@pytest.mark.parametrize("token_id", [2**31, 2**63])
def test_a_token_id_that_is_not_one_skips_the_prediction_not_the_turn(
    server: FakeServer, client_kind: Kind, token_id: int
) -> None:
    # Valid JSON, but past the int32 llama-server keeps a token id in: the prediction is off
    # for this turn, and the turn goes on.
    CachingLlama(server)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    server.route("POST", "/tokenize", json_reply({"tokens": [1, token_id]}))
    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))
    assert Content(ANSWER) in events and predictions(events) == []


# -- checkpoints --------------------------------------------------------------------------------


def saved_then_restarted(
    server: FakeServer,
    kind: Kind,
    **limits: int,
) -> tuple[CachingLlama, Client]:
    """One turn on slot 0, its checkpoint saved, and the server restarted (the slot emptied)."""
    llama = CachingLlama(server)
    client = client_for(kind, server, **limits)
    turn(client, SYSTEM, ASK)
    assert client.save_slot(0) is not None
    llama.restart()
    return llama, client


def test_a_checkpoint_is_restored_by_itself_after_a_restart(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="inferpath")
    llama = CachingLlama(server)
    client = client_for(client_kind, server, predict=False)  # a checkpoint is predicted either way
    turn(client, SYSTEM, ASK)
    checkpoint = client.save_slot(0)
    assert checkpoint is not None
    assert (checkpoint.slot, checkpoint.tokens) == (0, len(llama.held[0]))
    assert checkpoint.filename.startswith("inferpath-") and checkpoint.filename.endswith("-slot-0.bin")
    assert checkpoint.bytes == 100 * checkpoint.tokens
    llama.restart()
    del server.requests[:]

    [prediction] = predictions(turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?")))

    assert prediction.restored == checkpoint.tokens
    assert prediction.reused == llama.cache_n[1] and not prediction.lost
    assert "POST /slots/0?action=restore&autoload=false" in paths(server)
    assert paths(server)[-1] == "POST /v1/chat/completions"
    # the save rendered turn 1 once and kept it: this turn rendered only itself
    assert paths(server).count("POST /apply-template?autoload=false") == 1
    assert caplog.records == []  # it helped: nothing to say


def test_a_checkpoint_saved_under_another_template_is_not_restored(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    llama, client = saved_then_restarted(server, client_kind)
    llama.template = "another template"
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        [prediction] = predictions(turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("Spain?")))
    assert (prediction.restored, prediction.cause, prediction.reused) == (0, CacheCause.SLOT_EMPTIED, 0)
    assert "POST /slots/0?action=restore&autoload=false" not in paths(server)
    assert any("not restored: the server's chat template" in r.getMessage() for r in caplog.records)


def test_a_restore_that_did_not_help_says_so(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    llama, client = saved_then_restarted(server, client_kind)
    llama.restore_lies = True
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        [prediction] = predictions(turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("Spain?")))
    assert prediction.restored > 0 and llama.cache_n[1] == 0
    assert any("the restored checkpoint did not help" in r.getMessage() for r in caplog.records)


def test_a_server_without_a_save_folder_turns_checkpoints_off_with_one_warning(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    CachingLlama(server, save_path=False)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        assert client.save_slot(0) is None
        assert client.save_slot(1) is None
    assert paths(server).count("POST /slots/0?action=save&autoload=false") == 1
    assert not any("action=save" in p for p in paths(server) if p.startswith("POST /slots/1"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "--slot-save-path" in warnings[0]


def test_restore_slot_puts_the_checkpoint_back_and_refuses_what_does_not_match(
    server: FakeServer, client_kind: Kind
) -> None:
    llama = CachingLlama(server)
    client = client_for(client_kind, server)
    with pytest.raises(RequestError, match="slot 0 has no checkpoint"):
        client.restore_slot(0)
    turn(client, SYSTEM, ASK)
    saved = llama.held[0]
    checkpoint = client.save_slot(0)
    assert checkpoint is not None
    llama.restart()
    assert client.restore_slot(0) == checkpoint.tokens and llama.held[0] == saved
    llama.template = "another"
    with pytest.raises(RequestError, match="chat template"):
        client.restore_slot(0)


def test_a_slot_that_is_not_the_servers_is_refused_before_any_request(server: FakeServer, client_kind: Kind) -> None:
    CachingLlama(server)
    client = client_for(client_kind, server)
    with pytest.raises(RequestError, match="slot 5 is outside the server's 2 slots"):
        client.save_slot(5)
    with pytest.raises(RequestError, match="slot -1 is negative"):
        client.restore_slot(-1)
    assert all(not p.startswith("POST /slots") for p in paths(server))


def test_a_closed_client_saves_and_restores_nothing(server: FakeServer, client_kind: Kind) -> None:
    CachingLlama(server)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    client.close()
    del server.requests[:]
    with pytest.raises(ClientClosed):
        client.save_slot(0)
    with pytest.raises(ClientClosed):
        client.restore_slot(0)
    assert server.requests == []


def test_a_cancelled_token_saves_nothing(server: FakeServer, client_kind: Kind) -> None:
    CachingLlama(server)
    client = client_for(client_kind, server)
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        client.save_slot(0, token)
    assert all(not p.startswith("POST /slots") for p in paths(server))


MARKER = "MARKER-77d2a0"


def test_the_prediction_and_the_checkpoints_log_no_text_of_the_server_or_the_caller(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    llama = CachingLlama(server, reasoning=f"thinking of {MARKER} " * 8, template=f"template {MARKER}")
    client = client_for(client_kind, server)
    system = SystemMessage(f"rules with {MARKER} " * 8)
    with caplog.at_level(logging.DEBUG, logger="inferpath"):
        turn(client, system, ASK, thinking=True)
        turn(client, system, ASK, AssistantMessage(ANSWER), UserMessage(MARKER), thinking=True)  # dropped
        assert client.save_slot(0) is not None
        llama.restart()
        llama.template = f"another {MARKER}"  # not restored: the template changed
        turn(client, system, UserMessage(MARKER))
        llama.template = f"template {MARKER}"
        assert client.save_slot(0) is not None
        llama.restart()
        llama.restore_lies = True  # restored, and it did not help
        turn(client, system, UserMessage(MARKER), AssistantMessage(ANSWER), UserMessage(MARKER))
        server.route("GET", "/slots", error_reply(500, f"broken {MARKER}"))
        turn(client, system, UserMessage(MARKER))
        server.route("POST", "/apply-template", error_reply(404, f"no such {MARKER}", "not_found_error"))
        turn(client, system, UserMessage(MARKER))
    messages = [r.getMessage() for r in caplog.records]
    assert any("not restored" in m for m in messages) and any("did not help" in m for m in messages)
    assert any("prediction skipped" in m for m in messages) and any("prediction off" in m for m in messages)
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    assert [formatter.format(r) for r in caplog.records if MARKER in formatter.format(r)] == []


def test_a_server_that_does_not_answer_the_prediction_delays_the_turn_by_a_probe_timeout(
    server: FakeServer, client_kind: Kind
) -> None:
    CachingLlama(server)
    client = client_for(client_kind, server, poll_ms=100)
    turn(client, SYSTEM, ASK)
    server.route("POST", "/apply-template", silence())
    started = time.monotonic()
    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))
    elapsed = time.monotonic() - started
    assert Content(ANSWER) in events and predictions(events) == []
    # the probe's limit is min(poll_ms, 2 s) = 100 ms here; the chat itself takes a few ms
    assert 0.1 <= elapsed < 0.5, elapsed


def test_an_older_checkpoint_is_predicted_by_what_it_covers(server: FakeServer, client_kind: Kind) -> None:
    llama = CachingLlama(server)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    checkpoint = client.save_slot(0)
    assert checkpoint is not None
    history = [SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?")]
    turn(client, *history)  # a turn the checkpoint does not hold
    llama.restart()

    [prediction] = predictions(turn(client, *history, AssistantMessage(ANSWER), UserMessage("And of Italy?")))

    assert prediction.restored == checkpoint.tokens
    # no more than the prompt it covers is counted on, and the server reuses at least that
    assert prediction.reused == checkpoint.prompt_tokens <= llama.cache_n[2]


def test_a_checkpoint_is_not_restored_before_a_request_that_does_not_begin_with_its_prompt(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    llama = CachingLlama(server)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    assert client.save_slot(0) is not None
    other = [SystemMessage("Other rules."), ASK]
    turn(client, *other)  # the slot moves on to another conversation
    llama.restart()
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        [prediction] = predictions(turn(client, *other, AssistantMessage(ANSWER), UserMessage("More.")))
    assert (prediction.restored, prediction.cause) == (0, CacheCause.SLOT_EMPTIED)
    assert "POST /slots/0?action=restore&autoload=false" not in paths(server)
    assert any("the request does not begin with the prompt it covers" in r.getMessage() for r in caplog.records)


def test_a_restore_the_server_refuses_is_said_and_the_turn_goes_on(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    llama, client = saved_then_restarted(server, client_kind)
    llama.files.clear()  # the server lost the file: 400
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))
    [prediction] = predictions(events)
    assert (prediction.restored, prediction.cause) == (0, CacheCause.SLOT_EMPTIED) and Content(ANSWER) in events
    assert any("not restored: HttpError (HTTP 400)" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("status", [404, 501])
def test_a_server_that_cannot_render_still_saves_and_restores_a_checkpoint(
    server: FakeServer, client_kind: Kind, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    # The checkpoint's record of the prompt it covers needs a rendering; a server without one
    # still keeps the slot's KV cache: saved, with no prompt on record, and restored by hand.
    llama = CachingLlama(server)
    server.route("POST", "/apply-template", error_reply(status, "File Not Found", "not_found_error"))
    client = client_for(client_kind, server, predict=False)
    turn(client, SYSTEM, ASK)
    saved = llama.held[0]
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        checkpoint = client.save_slot(0)
        assert checkpoint is not None and checkpoint.tokens == len(saved)
        assert checkpoint.prompt_tokens == 0
        assert client.save_slot(0) is not None  # asked to render once, and warned once
    assert paths(server).count("POST /apply-template?autoload=false") == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"cache prediction off: the server cannot render a prompt (HTTP {status})"]
    llama.restart()
    assert client.restore_slot(0) == checkpoint.tokens and llama.held[0] == saved
    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))
    assert Content(ANSWER) in events and predictions(events) == []  # nothing predicted: it cannot render


def test_a_restore_the_server_answers_with_0_tokens_is_said_not_restored(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    llama, client = saved_then_restarted(server, client_kind)
    for name in llama.files:
        llama.files[name] = []  # the file holds nothing: the server restores 0 tokens
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        [prediction] = predictions(turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?")))
    assert "POST /slots/0?action=restore&autoload=false" in paths(server)
    assert (prediction.restored, prediction.cause) == (0, CacheCause.SLOT_EMPTIED)
    assert any("not restored: the server restored 0 tokens" in r.getMessage() for r in caplog.records), caplog.text


def test_a_checkpoint_with_no_prompt_on_record_is_never_restored_by_itself(
    server: FakeServer, client_kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    # Saved while the slot held another client's conversation: nothing says which requests it fits.
    llama = CachingLlama(server)
    turn(client_for(client_kind, server), SYSTEM, ASK)
    client = client_for(client_kind, server)
    checkpoint = client.save_slot(0)
    assert checkpoint is not None and checkpoint.prompt_tokens == 0 and checkpoint.tokens > 0
    turn(client, SYSTEM, UserMessage("And of Spain?"))
    llama.restart()
    del server.requests[:]
    with caplog.at_level(logging.WARNING, logger="inferpath"):
        events = turn(client, SYSTEM, UserMessage("And of Spain?"), AssistantMessage(ANSWER), UserMessage("Why?"))
    [prediction] = predictions(events)
    assert "POST /slots/0?action=restore&autoload=false" not in paths(server)
    assert prediction.restored == 0
    assert any("not restored: it has no prompt on record" in r.getMessage() for r in caplog.records), caplog.text


class CuttingLlama(CachingLlama):
    """Takes the next request's prompt into its slot as any other, then cuts its stream: the
    call fails after the server processed the prompt (as a cancel or a failure would leave it)."""

    cut_next = False

    def _chat(self, request: RecordedRequest) -> Reply:
        whole = super()._chat(request)
        if not self.cut_next:
            return whole
        self.cut_next = False
        return sse_reply([chunk(ROLE, n=0)], done=False, end=End.RESET)


def test_a_request_that_failed_after_the_server_took_its_prompt_is_not_predicted_from(
    server: FakeServer, client_kind: Kind
) -> None:
    llama = CuttingLlama(server)
    client = client_for(client_kind, server)
    turn(client, SYSTEM, ASK)
    llama.cut_next = True  # another conversation on the slot, cut after its prompt was processed
    with pytest.raises(StreamClosedEarly):
        turn(client, SystemMessage("Another session entirely, with other rules. " * 4), ASK)

    events = turn(client, SYSTEM, ASK, AssistantMessage(ANSWER), UserMessage("And of Spain?"))

    # The slot holds the failed request's prompt, not the first turn's: predicted from the first
    # turn, the reuse would have been claimed far above what the server found.
    assert [p for p in predictions(events) if p.reused > llama.cache_n[-1]] == []
