"""The self-test's verdicts on the in-memory fakes: every way each of the three checks fails, all
three passing, a server that cannot be reached, errors of any kind as one `FAIL` line, and
`main`'s exit code 2 for what cannot run. No sockets: the server is a `ScriptedTransport` that
answers each chat by what the request holds (tools: the tool-call check; slot 1: the request on
another slot between the cache turns; two messages: turn 1; four: turn 2), on a `FakeClock`, so a
retry's wait costs no real time.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from adapters.fake_server import FakeClock, FakeSlotProbe, RecordedRequest, ScriptedTransport, json_reply, sse_reply
from adapters.fake_server.script import Script
from app import selftest
from app.config import Config, ConfigError, parse_config
from app.container import Container, request_settings
from app.selftest import Report, run
from app.selftest_checks import (
    MAX_TOKENS,
    OTHER_MAX_TOKENS,
    OTHER_PROMPT,
    SYSTEM,
    TOOL,
    TOOL_PROMPT,
    TURN1_PROMPT,
    TURN2_PROMPT,
    cache_check_floor,
)
from client_support import CHAT, PROPS, ROLE, chunk, overridden
from domain.messages import AssistantMessage, ChatRequest, UserMessage
from domain.request import RequestError, build_chat_body

pytestmark = pytest.mark.timeout(10)

TEMPLATE = "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
TEMPLATE_SHA = hashlib.sha256(TEMPLATE.encode("utf-8")).hexdigest()
EXPECT = {"chat_template_sha256": TEMPLATE_SHA, "n_ctx": 4096, "total_slots": 2}
PROPS_ANSWER: dict[str, Any] = {
    "default_generation_settings": {"n_ctx": 4096},
    "total_slots": 2,
    "model_alias": "test-model",
    "chat_template": TEMPLATE,
}
ARGS = '{"city": "Paris"}'


def tool_answer(
    arguments: str = ARGS, *, finish: str = "tool_calls", name: str = "get_time", content: str | None = None
) -> list[dict[str, Any]]:
    """The tool check's answer: a call of `name`, or the text `content` where the call would be."""
    call = {
        "index": 0,
        "id": "X3kXjv1zQ5sA9gJ0mRr2cTn7bYw4pLdE",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    delta: dict[str, Any] = {"tool_calls": [call]} if content is None else {"content": content}
    return [
        chunk(ROLE, n=0, prompt_n=150),
        chunk(delta, n=5, prompt_n=150),
        chunk(finish=finish, n=6, prompt_n=150),
    ]


def text_answer(text: str, *, cache_n: int, prompt_n: int, n: int = 6) -> list[dict[str, Any]]:
    return [
        chunk(ROLE, n=0, cache_n=cache_n, prompt_n=prompt_n),
        chunk({"content": text}, n=n, cache_n=cache_n, prompt_n=prompt_n),
        chunk(finish="stop", n=n, cache_n=cache_n, prompt_n=prompt_n),
    ]


# Turn 1 leaves 3 + 380 + 6 = 389 tokens in the slot; turn 2 finds 388 of them cached.
TURN1 = text_answer("The sky is blue.", cache_n=3, prompt_n=380)
TURN2 = text_answer("Grass is green.", cache_n=388, prompt_n=20)
# The request on slot 1 between the turns: 12 tokens in, 4 out.
OTHER = text_answer("Yes.", cache_n=0, prompt_n=12, n=4)
# What a cache loss after that request adds to the cache check's line.
UNIFIED_HINT = (
    "; likely cause: the server empties idle slots whenever another slot starts a task, as it does "
    "with a unified KV cache (started without -np, or with --kv-unified; its per-slot n_ctx in "
    "/props is then the whole -c); start it with -np N --no-kv-unified"
)


@dataclass
class Server:
    """What the fake server answers; each field is one route's reply (or the error to raise)."""

    props: Script | BaseException = field(default_factory=lambda: json_reply(PROPS_ANSWER))
    tool: list[dict[str, Any]] = field(default_factory=tool_answer)
    turn1: list[dict[str, Any]] = field(default_factory=lambda: TURN1)
    turn2: list[dict[str, Any]] = field(default_factory=lambda: TURN2)
    other: list[dict[str, Any]] | BaseException = field(default_factory=lambda: OTHER)

    def answer_props(self, request: RecordedRequest) -> Script:
        if isinstance(self.props, BaseException):
            raise self.props
        return self.props

    def answer_chat(self, request: RecordedRequest) -> Script:
        body = request.json()
        if "tools" in body:
            return sse_reply(self.tool)
        if body["id_slot"] == 1:
            if isinstance(self.other, BaseException):
                raise self.other
            return sse_reply(self.other)
        return sse_reply(self.turn1 if len(body["messages"]) == 2 else self.turn2)


@dataclass
class Outcome:
    report: Report
    lines: list[str]
    transport: ScriptedTransport

    def chats(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.transport.requests if (r.method, r.path) == CHAT]

    def chat_slots(self) -> list[int]:
        """The slot of each chat, in the order sent."""
        return [body["id_slot"] for body in self.chats()]


@pytest.fixture
def selftest_on() -> Iterator[Callable[..., Outcome]]:
    """Run the self-test against `Server` on the in-memory fakes, with the config's changes."""

    def go(server: Server, *, refusing: bool = False, **sections: Any) -> Outcome:
        config = parse_config({"socket": "/fake/llama.sock", "expect": EXPECT, **sections})
        clock = FakeClock()
        transport = ScriptedTransport(clock, {PROPS: server.answer_props, CHAT: server.answer_chat})
        transport.refusing = refusing
        container = make(selftest.selftest_config(config), clock=clock, transport=transport, probe=FakeSlotProbe())
        lines: list[str] = []
        report = run(config, container.client(), lines.append)
        return Outcome(report, lines, transport)

    with overridden() as make:
        yield go


def check_lines(outcome: Outcome) -> list[str]:
    assert len(outcome.lines) == 4, outcome.lines
    return outcome.lines[:3]


def assert_summary(outcome: Outcome, passed: int) -> None:
    verdict = "ok  " if passed == 3 else "FAIL"
    assert re.fullmatch(
        rf"{verdict} selftest: {passed}/3 checks passed in \d+\.\d s, {outcome.report.tokens} tokens", outcome.lines[3]
    ), outcome.lines[3]
    assert outcome.report.ok is (passed == 3)


# -- all three pass -------------------------------------------------------------------------------


def test_all_three_checks_pass_against_the_server_the_config_describes(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server())

    assert check_lines(outcome) == [
        f"ok   props: chat_template sha256 {TEMPLATE_SHA} == expected, n_ctx 4096 == expected, "
        "total_slots 2 == expected",
        'ok   tool call: get_time({"city": "Paris"}) parsed, finish_reason tool_calls, 156 tokens',
        "ok   cache: turn 2 reused 388 of 389 tokens (loss limit 64) after a request on slot 1, 428 tokens",
    ]
    assert outcome.report.tokens == 156 + 386 + 16 + 26
    assert_summary(outcome, 3)


def test_the_checks_send_capped_answers_and_turn_2_replays_turn_1(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server())

    tool, turn1, other, turn2 = outcome.chats()
    assert [body["max_tokens"] for body in (tool, turn1, other, turn2)] == [MAX_TOKENS, MAX_TOKENS, 4, MAX_TOKENS]
    assert [body["id_slot"] for body in (tool, turn1, other, turn2)] == [0, 0, 1, 0]
    assert tool["tool_choice"] == "required"
    assert turn1["messages"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURN1_PROMPT}]
    assert turn2["messages"][:2] == turn1["messages"]
    assert turn2["messages"][2]["role"] == "assistant"
    assert turn2["messages"][2]["content"] == "The sky is blue."
    assert turn2["messages"][3] == {"role": "user", "content": TURN2_PROMPT}


def test_the_system_prompt_is_long_enough_for_a_miss_to_be_a_loss() -> None:
    # Four characters a token undercounts this English text: the small model's tokenizer makes 381.
    assert len(SYSTEM) / 4 > 2 * cache_check_floor(64)


# -- props ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected_line"),
    [
        (
            {"chat_template": "{{ messages }}"},
            f"FAIL props: chat_template sha256 {hashlib.sha256(b'{{ messages }}').hexdigest()} "
            f"!= expected {TEMPLATE_SHA}",
        ),
        ({"default_generation_settings": {"n_ctx": 2048}}, "FAIL props: n_ctx 2048 != expected 4096"),
        ({"total_slots": 4}, "FAIL props: total_slots 4 != expected 2"),
    ],
    ids=["template-hash", "n_ctx", "total_slots"],
)
def test_props_fails_naming_the_value_that_differs(
    selftest_on: Callable[..., Outcome], change: dict[str, Any], expected_line: str
) -> None:
    outcome = selftest_on(Server(props=json_reply({**PROPS_ANSWER, **change})))

    assert check_lines(outcome)[0] == expected_line
    assert outcome.lines[1].startswith("ok   tool call:")
    assert outcome.lines[2].startswith("ok   cache:")
    assert_summary(outcome, 2)


def test_props_names_every_value_that_differs(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(
        Server(props=json_reply({**PROPS_ANSWER, "total_slots": 1, "default_generation_settings": {"n_ctx": 512}}))
    )

    assert check_lines(outcome)[0] == "FAIL props: n_ctx 512 != expected 4096; total_slots 1 != expected 2"


def test_a_props_answer_without_its_fields_is_a_protocol_error_line(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server(props=json_reply({"total_slots": 2})))

    line = check_lines(outcome)[0]
    assert line.startswith("FAIL props: ProtocolError: /props") and "chat_template" in line
    assert_summary(outcome, 2)


# -- tool call --------------------------------------------------------------------------------------


def test_tool_call_fails_when_the_model_calls_no_tool(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server(tool=text_answer("It is noon in Paris.", cache_n=0, prompt_n=150)))

    assert check_lines(outcome)[1] == (
        "FAIL tool call: no get_time call (calls: none; finish_reason stop; content 'It is noon in Paris.'); "
        "a model that does not call tools on its own needs [selftest] tool_prefill, "
        "the opening of a call in its template's syntax"
    )
    assert_summary(outcome, 2)


def test_tool_call_without_a_call_despite_a_prefill_says_to_check_the_prefill(
    selftest_on: Callable[..., Outcome],
) -> None:
    outcome = selftest_on(
        Server(tool=text_answer("It is noon.", cache_n=0, prompt_n=150)), selftest={"tool_prefill": "<tool_call>"}
    )

    assert check_lines(outcome)[1] == (
        "FAIL tool call: no get_time call (calls: none; finish_reason stop; content 'It is noon.'); "
        "[selftest] tool_prefill is set: check that it opens a call in this template's syntax"
    )


def test_tool_call_fails_when_the_model_calls_another_tool(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server(tool=tool_answer(name="get_weather")))

    assert check_lines(outcome)[1] == (
        "FAIL tool call: no get_time call (calls: ['get_weather']; finish_reason tool_calls; no content)"
    )


def test_tool_call_fails_when_the_arguments_are_not_json(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server(tool=tool_answer('{"city": "Par')))

    line = check_lines(outcome)[1]
    assert line.startswith("FAIL tool call: get_time arguments are not JSON (")
    assert line.endswith(""": '{"city": "Par'""")
    assert_summary(outcome, 2)


@pytest.mark.parametrize("arguments", ['{"city": NaN}', '{"city": Infinity}', '{"city": -Infinity}', "{'city': 1}"])
def test_tool_call_fails_when_the_arguments_hold_what_json_has_not(
    selftest_on: Callable[..., Outcome], arguments: str
) -> None:
    outcome = selftest_on(Server(tool=tool_answer(arguments)))

    assert check_lines(outcome)[1].startswith("FAIL tool call: get_time arguments are not JSON (")
    assert_summary(outcome, 2)


@pytest.mark.parametrize("arguments", ['"Paris"', '["Paris"]', "42", "null"])
def test_tool_call_fails_when_the_arguments_are_json_but_not_an_object(
    selftest_on: Callable[..., Outcome], arguments: str
) -> None:
    outcome = selftest_on(Server(tool=tool_answer(arguments)))

    assert check_lines(outcome)[1].startswith("FAIL tool call: get_time arguments are not an object: ")
    assert_summary(outcome, 2)


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_tool_call_fails_when_finish_reason_is_not_tool_calls(selftest_on: Callable[..., Outcome], finish: str) -> None:
    outcome = selftest_on(Server(tool=tool_answer(finish=finish)))

    assert check_lines(outcome)[1] == f"FAIL tool call: finish_reason {finish}, expected tool_calls"
    assert_summary(outcome, 2)


# -- cache ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cached", [0, 3, 200, 324])
def test_cache_fails_when_turn_2_reused_too_little(selftest_on: Callable[..., Outcome], cached: int) -> None:
    outcome = selftest_on(Server(turn2=text_answer("Grass is green.", cache_n=cached, prompt_n=405 - cached)))

    tokens = 386 + 16 + (405 - cached) + 6
    assert check_lines(outcome)[2] == (
        f"FAIL cache: turn 2 reused {cached} of 389 tokens (loss limit 64) after a request on slot 1, "
        f"{tokens} tokens" + UNIFIED_HINT
    )
    assert_summary(outcome, 2)


def test_cache_passes_when_turn_2_is_exactly_the_loss_limit_short(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server(turn2=text_answer("Grass is green.", cache_n=325, prompt_n=80)))

    assert check_lines(outcome)[2].startswith("ok   cache: turn 2 reused 325 of 389 tokens")


def test_cache_fails_when_turn_1_left_too_few_tokens_for_the_check_to_mean_anything(
    selftest_on: Callable[..., Outcome],
) -> None:
    # 56 tokens, as the self-test's first turn measured before it had a long system prompt: a turn 2
    # that reused nothing at all would have been only 56 short, a "hit" under the limit of 64.
    outcome = selftest_on(Server(turn1=text_answer("Blue.", cache_n=0, prompt_n=50)))

    assert check_lines(outcome)[2] == (
        "FAIL cache: turn 1 left only 56 tokens in the slot, too few for the check to mean anything: "
        "it needs more than 128 (twice the loss limit 64), or a turn 2 that reused half of them would pass"
    )
    assert len(outcome.chats()) == 2  # neither the other slot's request nor turn 2: they would prove nothing
    assert outcome.report.results[2].tokens == 56
    assert_summary(outcome, 2)


@pytest.mark.parametrize(("left", "ok"), [(128, False), (129, True)])
def test_turn_1_must_leave_more_than_twice_the_loss_limit(
    selftest_on: Callable[..., Outcome], left: int, ok: bool
) -> None:
    outcome = selftest_on(
        Server(
            turn1=text_answer("Blue.", cache_n=0, prompt_n=left - 6),
            turn2=text_answer("Green.", cache_n=left - 1, prompt_n=20),
        )
    )

    assert check_lines(outcome)[2].startswith("ok   cache:" if ok else f"FAIL cache: turn 1 left only {left} tokens")


def test_the_floor_follows_the_configured_loss_limit(selftest_on: Callable[..., Outcome]) -> None:
    # The same 389 tokens that pass under the default limit are too few under a limit of 200.
    outcome = selftest_on(Server(), limits={"cache_loss_tokens": 200})

    assert check_lines(outcome)[2].startswith(
        "FAIL cache: turn 1 left only 389 tokens in the slot, too few for the check to mean anything: "
        "it needs more than 400 (twice the loss limit 200)"
    )


# -- cache: the request on another slot between the turns -------------------------------------------

ONE_SLOT = {"props": json_reply({**PROPS_ANSWER, "total_slots": 1})}


def test_a_short_request_on_slot_1_runs_between_the_two_turns_on_slot_0(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server())

    assert outcome.chat_slots() == [0, 0, 1, 0]  # the tool check, turn 1, the other slot, turn 2
    other = outcome.chats()[2]
    assert other["messages"] == [{"role": "user", "content": OTHER_PROMPT}]
    assert other["max_tokens"] == OTHER_MAX_TOKENS
    assert other["chat_template_kwargs"] == {"enable_thinking": False}
    assert "tools" not in other


def test_a_cache_loss_after_the_other_slots_request_names_the_unified_cache_and_the_flags(
    selftest_on: Callable[..., Outcome],
) -> None:
    # A unified KV cache: slot 1 starting a task emptied slot 0, so turn 2 prefills everything.
    outcome = selftest_on(Server(turn2=text_answer("Grass is green.", cache_n=0, prompt_n=405)))

    assert check_lines(outcome)[2] == (
        "FAIL cache: turn 2 reused 0 of 389 tokens (loss limit 64) after a request on slot 1, 813 tokens" + UNIFIED_HINT
    )
    assert "-np N --no-kv-unified" in outcome.lines[2]
    assert outcome.report.results[2].tokens == 386 + 16 + 405 + 6
    assert_summary(outcome, 2)


def test_a_hit_after_the_other_slots_request_carries_no_hint(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server())

    assert "likely cause" not in outcome.lines[2]
    assert "kv-unified" not in outcome.lines[2]


def test_on_a_server_of_one_slot_the_other_slots_request_is_skipped_and_the_line_says_so(
    selftest_on: Callable[..., Outcome],
) -> None:
    outcome = selftest_on(Server(**ONE_SLOT), expect={**EXPECT, "total_slots": 1})

    assert outcome.chat_slots() == [0, 0, 0]
    assert check_lines(outcome)[2] == (
        "ok   cache: turn 2 reused 388 of 389 tokens (loss limit 64; one slot, so no request on another slot), "
        "412 tokens"
    )
    assert_summary(outcome, 3)


def test_a_cache_loss_on_one_slot_does_not_blame_a_unified_cache(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(
        Server(turn2=text_answer("Grass is green.", cache_n=0, prompt_n=405), **ONE_SLOT),
        expect={**EXPECT, "total_slots": 1},
    )

    assert check_lines(outcome)[2] == (
        "FAIL cache: turn 2 reused 0 of 389 tokens (loss limit 64; one slot, so no request on another slot), 797 tokens"
    )


@pytest.mark.parametrize(
    ("other", "error"),
    [
        (
            [chunk(ROLE, n=0), {"error": {"code": 500, "message": "slot 1 is gone", "type": "server_error"}}],
            "HttpError",
        ),
        (RuntimeError("no slot 1 here"), "RuntimeError"),
    ],
    ids=["error-in-stream", "raised"],
)
def test_a_failing_request_on_the_other_slot_fails_the_cache_check_naming_that_step(
    selftest_on: Callable[..., Outcome], other: Any, error: str
) -> None:
    outcome = selftest_on(Server(other=other))

    line = check_lines(outcome)[2]
    assert line.startswith(
        f"FAIL cache: the request on slot 1 between the two turns failed, so turn 2 was not sent: {error}: "
    ), line
    assert ("slot 1 is gone" if error == "HttpError" else "no slot 1 here") in line
    assert outcome.chat_slots() == [0, 0, 1]  # turn 2 is not sent
    assert outcome.report.results[2].tokens == 386  # turn 1's
    assert_summary(outcome, 2)


@dataclass
class OneSlotOnSecondAsk(Server):
    """A `/props` that answers `first` (or raises it) once, then says the server has one slot."""

    first: Script | BaseException = field(default_factory=lambda: json_reply(PROPS_ANSWER))
    asked: int = 0

    def answer_props(self, request: RecordedRequest) -> Script:
        self.asked += 1
        if self.asked > 1:
            return json_reply({**PROPS_ANSWER, "total_slots": 1})
        if isinstance(self.first, BaseException):
            raise self.first
        return self.first


def test_the_cache_check_takes_the_slot_count_from_check_1s_props(selftest_on: Callable[..., Outcome]) -> None:
    # Asked again, /props would say one slot: the request on slot 1 still runs, so check 1's
    # answer (two slots) is the one used.
    outcome = selftest_on(OneSlotOnSecondAsk())

    assert outcome.chat_slots() == [0, 0, 1, 0]
    assert outcome.lines[2].startswith("ok   cache: turn 2 reused 388 of 389 tokens (loss limit 64) after a request")


def test_the_cache_check_asks_props_itself_when_check_1_could_not_read_it(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(OneSlotOnSecondAsk(first=RuntimeError("props not ready")))

    assert outcome.lines[0].startswith("FAIL props: RuntimeError: props not ready")
    # The server's own answer (one slot) rules, not the config's [expect] (two).
    assert outcome.chat_slots() == [0, 0, 0]
    assert "one slot, so no request on another slot" in outcome.lines[2]


def test_when_props_cannot_be_read_at_all_the_slot_count_comes_from_expect(
    selftest_on: Callable[..., Outcome],
) -> None:
    outcome = selftest_on(Server(props=RuntimeError("props broken")))

    assert outcome.lines[0].startswith("FAIL props: RuntimeError: props broken")
    assert outcome.chat_slots() == [0, 0, 1, 0]  # [expect] says two slots
    assert outcome.lines[2].startswith("ok   cache: turn 2 reused 388 of 389 tokens (loss limit 64) after a request")


# -- a server that cannot be reached, and errors of any kind ---------------------------------------


def test_a_server_that_refuses_connections_fails_props_and_runs_nothing_else(
    selftest_on: Callable[..., Outcome],
) -> None:
    outcome = selftest_on(Server(), refusing=True)

    assert check_lines(outcome) == [
        "FAIL props: ConnectError: cannot connect to /fake/llama.sock: connection refused "
        "(nobody is listening on the socket)",
        "FAIL tool call: not run: the server is unreachable (ConnectError)",
        "FAIL cache: not run: the server is unreachable (ConnectError)",
    ]
    assert outcome.transport.requests == []
    assert_summary(outcome, 0)
    assert outcome.report.tokens == 0


def test_a_request_error_is_a_fail_line_naming_it_and_the_next_check_runs(
    selftest_on: Callable[..., Outcome],
) -> None:
    outcome = selftest_on(Server(props=RequestError("slot 0 is out of range: the server has 0 slots")))

    assert check_lines(outcome)[0].startswith(
        "FAIL props: RequestError: slot 0 is out of range: the server has 0 slots"
    )
    assert outcome.lines[1].startswith("ok   tool call:")
    assert outcome.lines[2].startswith("ok   cache:")
    assert_summary(outcome, 2)


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyError("n_ctx"), AssertionError()], ids=repr)
def test_a_bug_in_a_check_is_a_fail_line_naming_it_and_where_it_was_raised(
    selftest_on: Callable[..., Outcome], error: Exception
) -> None:
    outcome = selftest_on(Server(props=error))

    named = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    line = check_lines(outcome)[0]
    assert re.fullmatch(rf"FAIL props: {re.escape(named)} \(raised at test_selftest\.py:\d+ in answer_props\)", line)
    assert outcome.lines[1].startswith("ok   tool call:")
    assert outcome.lines[2].startswith("ok   cache:")
    assert_summary(outcome, 2)


def test_an_error_message_over_several_lines_stays_on_its_check_line(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server(props=ValueError("first line\nsecond line")))

    assert outcome.lines[0].startswith("FAIL props: ValueError: first line\\nsecond line (raised at ")
    assert len(outcome.lines) == 4


def test_a_fail_line_escapes_the_servers_control_characters(selftest_on: Callable[..., Outcome]) -> None:
    # A terminal would erase the line and show a forged one, ring, and retitle itself.
    forged = "boom\r\n\x1b[2K\rok   props: forged\x07\x00\x1b]0;title\x07"
    outcome = selftest_on(Server(props=ValueError(forged)))

    assert outcome.lines[0].startswith("FAIL props: ValueError: boom\\r\\n\\x1b[2K\\rok   props: forged\\x07\\x00")
    assert all(line.isprintable() for line in outcome.lines)
    assert len(outcome.lines) == 4


def test_an_error_inside_the_stream_fails_its_check_only(selftest_on: Callable[..., Outcome]) -> None:
    error = {"error": {"code": 500, "message": "tool parser failed", "type": "server_error"}}
    outcome = selftest_on(Server(tool=[chunk(ROLE, n=0), error]))

    assert check_lines(outcome)[1].startswith("FAIL tool call: HttpError: HTTP 500: ")
    assert "tool parser failed" in outcome.lines[1]
    assert outcome.lines[2].startswith("ok   cache:")


def test_keyboard_interrupt_is_not_turned_into_a_fail_line(selftest_on: Callable[..., Outcome]) -> None:
    with pytest.raises(KeyboardInterrupt):
        selftest_on(Server(props=KeyboardInterrupt()))


def test_run_refuses_a_config_without_expect() -> None:
    config = parse_config({"socket": "/fake/llama.sock"})

    with pytest.raises(selftest.ConfigError, match=r"needs an \[expect\] section"):
        run(config, object(), print)  # type: ignore[arg-type]


# -- main: what cannot run is exit 2, with one FAIL line --------------------------------------------


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


EXPECT_TOML = f'[expect]\nchat_template_sha256 = "{TEMPLATE_SHA}"\nn_ctx = 4096\ntotal_slots = 2\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "config file not found"),
        ('socket = "/fake/llama.sock"\n', r"needs an \[expect\] section"),
        ('socket = "/fake/llama.sock"\n[limits]\nlvieness_ms = 5\n' + EXPECT_TOML, "limits.lvieness_ms: unknown key"),
        ("socket = \n", "invalid TOML"),
    ],
    ids=["missing-file", "no-expect", "unknown-key", "bad-toml"],
)
def test_main_exits_2_with_one_fail_line_when_the_config_cannot_be_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, message: str
) -> None:
    path = str(tmp_path / "config.toml") if text is None else write(tmp_path / "config.toml", text)

    code = selftest.main(["--config", path])

    out, err = capsys.readouterr()
    assert code == 2
    assert len(out.splitlines()) == 1 and out.startswith("FAIL config: ")
    assert re.search(message, out)
    assert "Traceback" not in out + err


def test_main_exits_2_when_the_client_cannot_be_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_container(config: Config) -> Container:
        raise TypeError("transport needs a socket path")

    monkeypatch.setattr(selftest, "Container", broken_container)
    path = write(tmp_path / "config.toml", 'socket = "/fake/llama.sock"\n' + EXPECT_TOML)

    code = selftest.main(["--config", path])

    out, err = capsys.readouterr()
    assert code == 2
    assert out.splitlines() == [
        "FAIL setup: cannot build the client: TypeError: transport needs a socket path "
        "(raised at test_selftest.py:" + out.split("test_selftest.py:", 1)[1].split(" ", 1)[0] + " in broken_container)"
    ]
    assert "Traceback" not in out + err


def test_main_without_config_argument_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        selftest.main([])

    out, err = capsys.readouterr()
    assert exited.value.code == 2
    assert "--config" in err and "Traceback" not in out + err


def test_a_report_is_ok_only_with_three_passing_results() -> None:
    passing = selftest.CheckResult("props", True, "")
    assert not Report([passing, passing]).ok
    assert Report([passing, passing, passing]).ok
    assert not Report([passing, passing, replace(passing, ok=False)]).ok


# -- what each check sends, the tokens of a failing check, the words of the errors and of --help -----

CALL = {
    "index": 0,
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_time", "arguments": '{"city": "Paris"}'},
}


def turn_answer(*deltas: dict[str, Any], cache_n: int, prompt_n: int) -> list[dict[str, Any]]:
    """A cache turn's answer carrying each of `deltas` in a chunk of its own."""
    return [
        chunk(ROLE, n=0, cache_n=cache_n, prompt_n=prompt_n),
        *(chunk(delta, n=6, cache_n=cache_n, prompt_n=prompt_n) for delta in deltas),
        chunk(finish="stop", n=6, cache_n=cache_n, prompt_n=prompt_n),
    ]


def test_the_tool_check_asks_without_thinking_and_both_cache_turns_with_thinking(
    selftest_on: Callable[..., Outcome],
) -> None:
    outcome = selftest_on(Server())
    assert outcome.report.ok
    assert [body["chat_template_kwargs"] for body in outcome.chats()] == [
        {"enable_thinking": False},
        {"enable_thinking": True},
        {"enable_thinking": False},  # the request on the other slot: a few tokens, no thinking
        {"enable_thinking": True},
    ]


def test_the_prefill_is_sent_as_the_assistants_opening(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server(), selftest={"tool_prefill": "<tool_call>\n"})
    assert outcome.chats()[0]["messages"][-1] == {"role": "assistant", "content": "<tool_call>\n"}


def test_the_tool_request_with_its_prefill_is_byte_for_byte_the_one_ending_in_an_assistant_message(
    selftest_on: Callable[..., Outcome],
) -> None:
    prefill = '<tool_call>\n{"name": "get_time", "arguments": {"city": "'
    outcome = selftest_on(Server(), selftest={"tool_prefill": prefill})
    sent = next(r.body for r in outcome.transport.requests if (r.method, r.path) == CHAT)
    by_hand = ChatRequest(
        slot=0,
        messages=[UserMessage(TOOL_PROMPT), AssistantMessage(content=prefill)],
        tools=[TOOL],
        thinking=False,
        tool_choice="required",
    )
    config = selftest.selftest_config(parse_config({"socket": "/fake/llama.sock", "expect": EXPECT}))
    assert sent == build_chat_body(by_hand, request_settings(config), total_slots=2)


def test_without_a_prefill_the_tool_request_ends_with_the_users_message(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server())
    assert outcome.chats()[0]["messages"] == [{"role": "user", "content": TOOL_PROMPT}]


def test_turn_2_replays_turn_1s_reasoning_and_tool_calls(selftest_on: Callable[..., Outcome]) -> None:
    turn1 = turn_answer(
        {"reasoning_content": "Blue, by day."},
        {"content": "The sky is blue."},
        {"tool_calls": [CALL]},
        cache_n=3,
        prompt_n=380,
    )
    outcome = selftest_on(Server(turn1=turn1))
    replay = outcome.chats()[3]["messages"][2]
    assert replay == {
        "role": "assistant",
        "content": "The sky is blue.",
        "reasoning_content": "Blue, by day.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}
        ],
    }


def test_the_cache_check_judges_by_the_configured_loss_limit(selftest_on: Callable[..., Outcome]) -> None:
    # Turn 1 leaves 389 tokens; turn 2 finds 369 cached: 20 short, a loss under a limit of 10.
    turn2 = text_answer("Grass is green.", cache_n=369, prompt_n=40)
    outcome = selftest_on(Server(turn2=turn2), limits={"cache_loss_tokens": 10})
    cache = outcome.report.results[2]
    assert not cache.ok
    assert cache.detail.startswith("turn 2 reused 369 of 389 tokens (loss limit 10)")


@pytest.mark.parametrize(
    "tool",
    [
        tool_answer(content="It is noon."),
        tool_answer(arguments="{city: Paris"),
        tool_answer(arguments="[1, 2]"),
        tool_answer(finish="stop"),
    ],
    ids=["no-call", "not-json", "not-an-object", "wrong-finish"],
)
def test_a_failing_tool_check_still_counts_its_tokens(selftest_on: Callable[..., Outcome], tool: list[Any]) -> None:
    outcome = selftest_on(Server(tool=tool))
    result = outcome.report.results[1]
    assert not result.ok
    assert result.tokens == 156


def test_content_instead_of_a_call_is_quoted_up_to_80_characters(selftest_on: Callable[..., Outcome]) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    outcome = selftest_on(Server(tool=tool_answer(content=text)))
    detail = outcome.report.results[1].detail
    assert f"content {text[:80]!r})" in detail


def test_arguments_that_are_not_json_are_quoted_up_to_80_characters(selftest_on: Callable[..., Outcome]) -> None:
    arguments = "{" + "x" * 99
    outcome = selftest_on(Server(tool=tool_answer(arguments=arguments)))
    assert outcome.report.results[1].detail.endswith(f": {arguments[:80]!r}")


def test_the_ok_line_shows_long_arguments_cut_to_120_characters(selftest_on: Callable[..., Outcome]) -> None:
    arguments = '{"city": "' + "P" * 500 + '"}'
    outcome = selftest_on(Server(tool=tool_answer(arguments=arguments)))
    assert outcome.report.results[1].detail == (
        f"get_time({arguments[:120]}...) parsed, finish_reason tool_calls, {outcome.report.results[1].tokens} tokens"
    )


def test_the_ok_line_shows_arguments_on_one_line_their_control_characters_escaped(
    selftest_on: Callable[..., Outcome],
) -> None:
    arguments = '{\n  "city":\t"Paris"\n}'  # pretty-printed: JSON, on three lines
    outcome = selftest_on(Server(tool=tool_answer(arguments=arguments)))
    detail = outcome.report.results[1].detail
    assert detail.startswith('get_time({\\n  "city":\\t"Paris"\\n}) parsed')
    assert detail.isprintable()


def test_the_run_takes_as_long_as_it_took(selftest_on: Callable[..., Outcome]) -> None:
    assert 0.0 <= selftest_on(Server()).report.seconds < 60.0


def test_run_without_expect_says_which_section_and_keys_it_needs() -> None:
    with pytest.raises(ConfigError) as caught:
        selftest.run(parse_config({"socket": "/fake/llama.sock"}), object(), print)  # type: ignore[arg-type]
    assert str(caught.value) == ("the self-test needs an [expect] section (chat_template_sha256, n_ctx, total_slots)")


def test_help_says_what_the_command_and_each_option_do(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        selftest.main(["--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "The three startup checks." in out
    assert "--config CONFIG path to config.toml" in out
    assert (
        "--print-expect print the [expect] block that matches the live server, run no check ([expect] not needed)"
        in out
    )


def test_a_config_that_fails_to_load_unexpectedly_is_one_fail_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(path: str) -> object:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(selftest, "load_config", broken)
    code = selftest.main(["--config", str(tmp_path / "config.toml")])
    out = capsys.readouterr().out
    assert code == 2
    assert out.startswith("FAIL config: RuntimeError: disk on fire (raised at test_selftest.py:")
    assert out.endswith(" in broken)\n")
    assert len(out.splitlines()) == 1
