"""The startup self-test: the three checks of the brief, section 5.

1. The server is the one the config describes (`/props` against `[expect]`).
2. Tool calls parse (one tool, a fixed prompt, a parsed call with valid JSON arguments).
3. Turn 2 hits the cache (a two-turn exchange replaying turn 1's reasoning).

`python -m app.selftest --config PATH` prints one line per check, each starting `ok` or `FAIL`,
then a summary line, and exits 0 only if all three pass (1 if a check fails, 2 if it could not
run at all: a bad config or a missing `[expect]`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.client import Client
from app.config import Config, ConfigError, load_config
from app.container import Container
from domain.cache import cache_outcome
from domain.completion import Completion, FinishReason
from domain.errors import ConnectError, InferError, LoadTimeout
from domain.events import ChatEvent
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, SystemMessage, ToolSchema, UserMessage

MAIN_SLOT = 0
TOOL = ToolSchema(
    name="get_time",
    description="Get the current local time in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
)
TOOL_PROMPT = "What time is it in Paris right now? Call the get_time tool."
TURN1_PROMPT = "Name one colour of the sky. Answer in one short sentence."
TURN2_PROMPT = "Now name one colour of grass, in one short sentence."
SYSTEM = "You are a terse assistant."
# Each check's answer is capped, so the whole self-test costs about a thousand tokens even when a
# small model rambles or repeats its tool call.
MAX_TOKENS = 128


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str
    tokens: int = 0


@dataclass
class Report:
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return len(self.results) == 3 and all(r.ok for r in self.results)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.results)


def _ignore(_: ChatEvent) -> None:
    return None


def _tokens(completion: Completion) -> int:
    t = completion.timings
    return t.prompt_n + t.predicted_n


def check_props(client: Client, config: Config) -> CheckResult:
    expect = config.expect
    assert expect is not None
    props = client.props()
    pairs = [
        ("chat_template sha256", expect.chat_template_sha256, props.chat_template_sha256),
        ("n_ctx", expect.n_ctx, props.n_ctx),
        ("total_slots", expect.total_slots, props.total_slots),
    ]
    bad = [f"{name} {actual} != expected {want}" for name, want, actual in pairs if want != actual]
    if bad:
        return CheckResult("props", False, "; ".join(bad))
    detail = ", ".join(f"{name} {actual} == expected" for name, _, actual in pairs)
    return CheckResult("props", True, detail)


def check_tool_call(client: Client, config: Config) -> CheckResult:
    messages: list[ChatMessage] = [UserMessage(TOOL_PROMPT)]
    if config.selftest.tool_prefill:
        messages.append(AssistantMessage(content=config.selftest.tool_prefill))
    req = ChatRequest(slot=MAIN_SLOT, messages=messages, tools=[TOOL], thinking=False, tool_choice="required")
    completion = client.chat_with_retry(req, _ignore)
    tokens = _tokens(completion)
    calls = [c for c in completion.tool_calls if c.name == TOOL.name]
    if not calls:
        names = [c.name for c in completion.tool_calls] or "none"
        return CheckResult(
            "tool call", False,
            f"no {TOOL.name} call (calls: {names}; finish_reason {completion.finish_reason.value}; "
            f"content {str(completion.content)[:80]!r})", tokens,
        )
    try:
        args = json.loads(calls[0].arguments)
    except ValueError as exc:
        return CheckResult("tool call", False, f"{TOOL.name} arguments are not JSON ({exc}): "
                           f"{calls[0].arguments[:80]!r}", tokens)
    if not isinstance(args, dict):
        return CheckResult("tool call", False, f"{TOOL.name} arguments are not an object: {args!r}", tokens)
    if completion.finish_reason is not FinishReason.TOOL_CALLS:
        return CheckResult("tool call", False,
                           f"finish_reason {completion.finish_reason.value}, expected tool_calls", tokens)
    return CheckResult("tool call", True,
                       f"{TOOL.name}({calls[0].arguments}) parsed, finish_reason tool_calls, {tokens} tokens", tokens)


def check_cache(client: Client, config: Config) -> CheckResult:
    turn1: list[ChatMessage] = [SystemMessage(SYSTEM), UserMessage(TURN1_PROMPT)]
    first = client.chat_with_retry(ChatRequest(slot=MAIN_SLOT, messages=turn1, thinking=True), _ignore)
    replay = AssistantMessage(content=first.content, reasoning_content=first.reasoning_content,
                              tool_calls=list(first.tool_calls))
    turn2 = [*turn1, replay, UserMessage(TURN2_PROMPT)]
    second = client.chat_with_retry(ChatRequest(slot=MAIN_SLOT, messages=turn2, thinking=True), _ignore)
    tokens = _tokens(first) + _tokens(second)
    outcome = cache_outcome(first.timings, second.timings, config.limits.cache_loss_tokens)
    detail = (f"turn 2 reused {outcome.cached} of {outcome.expected} tokens "
              f"(loss limit {config.limits.cache_loss_tokens}), {tokens} tokens")
    return CheckResult("cache", not outcome.lost, detail, tokens)


CHECKS: list[tuple[str, Callable[[Client, Config], CheckResult]]] = [
    ("props", check_props),
    ("tool call", check_tool_call),
    ("cache", check_cache),
]


def run(config: Config, client: Client, emit: Callable[[str], None] = print) -> Report:
    """Run the three checks in order; a check that raises is a failure naming the error."""
    if config.expect is None:
        raise ConfigError("the self-test needs an [expect] section (chat_template_sha256, n_ctx, total_slots)")
    report = Report()
    started = time.monotonic()
    unreachable: str | None = None
    for name, check in CHECKS:
        if unreachable is not None:
            result = CheckResult(name, False, f"not run: {unreachable}")
        else:
            try:
                result = check(client, config)
            except InferError as exc:
                result = CheckResult(name, False, f"{type(exc).__name__}: {exc}")
                if isinstance(exc, ConnectError | LoadTimeout):
                    unreachable = f"the server is unreachable ({type(exc).__name__})"
        report.results.append(result)
        emit(f"{'ok  ' if result.ok else 'FAIL'} {result.name}: {result.detail}")
    report.seconds = time.monotonic() - started
    passed = sum(r.ok for r in report.results)
    emit(f"{'ok  ' if report.ok else 'FAIL'} selftest: {passed}/3 checks passed in {report.seconds:.1f} s, "
         f"{report.tokens} tokens")
    return report


def selftest_config(config: Config) -> Config:
    """The config the checks run with: the same server and limits, answers capped at MAX_TOKENS."""
    limits = config.limits.model_copy(update={"max_tokens": min(config.limits.max_tokens, MAX_TOKENS)})
    return config.model_copy(update={"limits": limits})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loopd-selftest", description="The three startup checks.")
    parser.add_argument("--config", required=True, help="path to config.toml")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        if config.expect is None:
            raise ConfigError(f"{args.config}: the self-test needs an [expect] section "
                              "(chat_template_sha256, n_ctx, total_slots)")
    except ConfigError as exc:
        print(f"FAIL config: {exc}", flush=True)
        return 2
    client = Container(config=selftest_config(config)).client()
    report = run(config, client, lambda line: print(line, flush=True))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
