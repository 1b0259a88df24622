"""The self-test's requests (thinking per check, the prefill, turn 2's replay of turn 1), the token
counts of failing checks, the configured loss limit, the words of its errors and of `--help`.
No sockets: a `ScriptedTransport` answers each chat by what the request holds."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from adapters.fake_server import FakeClock, FakeSlotProbe, RecordedRequest, ScriptedTransport, json_reply, sse_reply
from adapters.fake_server.script import Script
from app import selftest
from app.config import ConfigError, parse_config
from client_support import CHAT, PROPS, ROLE, chunk, overridden

pytestmark = pytest.mark.timeout(10)

TEMPLATE = "{{ messages }}"
EXPECT = {"chat_template_sha256": hashlib.sha256(TEMPLATE.encode()).hexdigest(), "n_ctx": 4096, "total_slots": 2}
PROPS_ANSWER = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2, "chat_template": TEMPLATE}
CALL = {
    "index": 0,
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_time", "arguments": '{"city": "Paris"}'},
}


def tool_answer(
    *, arguments: str = '{"city": "Paris"}', finish: str = "tool_calls", content: str | None = None
) -> list[dict[str, Any]]:
    delta: dict[str, Any] = {"tool_calls": [{**CALL, "function": {"name": "get_time", "arguments": arguments}}]}
    if content is not None:
        delta = {"content": content}
    return [chunk(ROLE, n=0, prompt_n=150), chunk(delta, n=5, prompt_n=150), chunk(finish=finish, n=6, prompt_n=150)]


def text_answer(*deltas: dict[str, Any], cache_n: int, prompt_n: int) -> list[dict[str, Any]]:
    return [
        chunk(ROLE, n=0, cache_n=cache_n, prompt_n=prompt_n),
        *(chunk(delta, n=6, cache_n=cache_n, prompt_n=prompt_n) for delta in deltas),
        chunk(finish="stop", n=6, cache_n=cache_n, prompt_n=prompt_n),
    ]


@dataclass
class Server:
    tool: list[dict[str, Any]] = field(default_factory=tool_answer)
    turn1: list[dict[str, Any]] = field(
        default_factory=lambda: text_answer({"content": "The sky is blue."}, cache_n=3, prompt_n=380)
    )
    turn2: list[dict[str, Any]] = field(
        default_factory=lambda: text_answer({"content": "Grass is green."}, cache_n=388, prompt_n=20)
    )

    def answer_chat(self, request: RecordedRequest) -> Script:
        body = request.json()
        if "tools" in body:
            return sse_reply(self.tool)
        return sse_reply(self.turn1 if len(body["messages"]) == 2 else self.turn2)


@dataclass
class Outcome:
    report: selftest.Report
    lines: list[str]
    chats: list[dict[str, Any]]


@pytest.fixture
def selftest_on() -> Iterator[Callable[..., Outcome]]:

    def go(server: Server, **sections: Any) -> Outcome:
        config = parse_config({"socket": "/fake/llama.sock", "expect": EXPECT, **sections})
        clock = FakeClock()
        transport = ScriptedTransport(clock, {PROPS: json_reply(PROPS_ANSWER), CHAT: server.answer_chat})
        container = make(selftest.selftest_config(config), clock=clock, transport=transport, probe=FakeSlotProbe())
        lines: list[str] = []
        report = selftest.run(config, container.client(), lines.append)
        chats = [r.json() for r in transport.requests if (r.method, r.path) == CHAT]
        return Outcome(report, lines, chats)

    with overridden() as make:
        yield go


def test_the_tool_check_asks_without_thinking_and_both_cache_turns_with_thinking(
    selftest_on: Callable[..., Outcome],
) -> None:
    outcome = selftest_on(Server())
    assert outcome.report.ok
    assert [body["chat_template_kwargs"] for body in outcome.chats] == [
        {"enable_thinking": False},
        {"enable_thinking": True},
        {"enable_thinking": True},
    ]


def test_the_prefill_is_sent_as_the_assistants_opening(selftest_on: Callable[..., Outcome]) -> None:
    outcome = selftest_on(Server(), selftest={"tool_prefill": "<tool_call>\n"})
    assert outcome.chats[0]["messages"][-1] == {"role": "assistant", "content": "<tool_call>\n"}


def test_turn_2_replays_turn_1s_reasoning_and_tool_calls(selftest_on: Callable[..., Outcome]) -> None:
    turn1 = text_answer(
        {"reasoning_content": "Blue, by day."},
        {"content": "The sky is blue."},
        {"tool_calls": [CALL]},
        cache_n=3,
        prompt_n=380,
    )
    outcome = selftest_on(Server(turn1=turn1))
    replay = outcome.chats[2]["messages"][2]
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
    turn2 = text_answer({"content": "Grass is green."}, cache_n=369, prompt_n=40)
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
    assert out.startswith("FAIL config: RuntimeError: disk on fire (raised at test_selftest_mutants.py:")
    assert out.endswith(" in broken)\n")
    assert len(out.splitlines()) == 1
