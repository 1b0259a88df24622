"""Sessions that outnumber the slots against the real llama-server, through a real `inferproxy`:
six sessions of about 1,500 tokens take turns on two slots, and every turn after a session's
first reuses at least 90 % of the prompt its previous turn sent, by the `cache_n` the server
reports. The server keeps no prompt cache in RAM (`--cache-ram 0`), and the sessions share only
the first half of their system prompt, which is all another session's prompt left in a slot
could give: only the sessions' own checkpoints, saved when a session is evicted and restored
when it returns, can give the rest."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import llama
import pytest
from proxy import ProxyProcess
from test_through_proxy import SAMPLING

from app.config import parse_config
from app.container import Container
from client_support import Kind
from domain.completion import Completion
from domain.events import ChatEvent, SessionMoved, SessionRestored, SessionSaved
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, SystemMessage, UserMessage

# a busy 2-core machine prefills the small model at 30 tokens a second, not 150: room for that
pytestmark = [pytest.mark.device, pytest.mark.timeout(600)]

SESSIONS = 6
TURNS = 4
# The asyncio flavour (`AsyncClient` behind the tests' bridge) runs a smaller round robin: the
# same moves, saves and restores, in half the time.
ASYNC_SESSIONS, ASYNC_TURNS = 3, 3
REUSED = 0.9
REPEAT = 4  # the rules, 4 times over: about 1,350 tokens
# The proxy's accept limit lifted: each moved turn makes a few small requests (a save, a render,
# a restore) and the test is about the cache, not the budget (tests/device/test_sessions_device.py).
LIFTED = ("--burst", "10000", "--rate", "10000")


def house_rules(tag: str, session: int) -> SystemMessage:
    """About 1,350 tokens of rules: the first half the same for every session of the run (as a
    daemon's sessions share a system prompt: a session's first turn reuses it from whichever
    session left it in the slot), the second half the session's own from its first token."""
    lines = [_rule(i, colour, size) for i, (colour, size) in enumerate(_pairs(), 1)]
    rules = "\n".join(lines * (REPEAT // 2))
    return SystemMessage(f"House {tag}.\n{rules}\nSession {session} of {tag}.\n{rules}")


def _rule(i: int, colour: str, size: str) -> str:
    return f"Rule {i}: when the user mentions item number {i}, describe it as {colour} and {size}."


def _pairs() -> list[tuple[str, str]]:
    colours, sizes = ("red", "green", "blue", "amber", "violet"), ("small", "large", "round")
    return [(colour, size) for colour in colours for size in sizes]


def prompt_tokens(completion: Completion) -> int:
    return completion.timings.cache_n + completion.timings.prompt_n


def test_six_sessions_on_two_slots_reuse_their_prompts_through_their_checkpoints(
    tmp_path: Path, client_kind: Kind
) -> None:
    sessions, turns = (ASYNC_SESSIONS, ASYNC_TURNS) if client_kind.is_async else (SESSIONS, TURNS)
    started = time.monotonic()
    with (
        llama.start_server("tools", log_dir=tmp_path, extra_args=("--cache-ram", "0")) as server,
        ProxyProcess(f"{server.host}:{server.port}", extra_args=LIFTED) as proxy,
    ):
        config: dict[str, Any] = {
            "socket": proxy.socket_path,
            "model": llama.ALIAS,
            "limits": {"max_tokens": 8, "liveness_ms": 180_000},
            "sampling": SAMPLING,
            "proxy": {"burst": 10000, "rate": 10000},
        }
        client = client_kind.client_of(Container(config=parse_config(config)))
        histories: dict[str, list[ChatMessage]] = {}
        last: dict[str, Completion] = {}
        reuse: list[tuple[str, int, int, int]] = []  # session, turn, cache_n, previous prompt
        events: list[ChatEvent] = []
        tag = secrets.token_hex(4)
        for turn in range(turns):
            for n in range(sessions):
                session = f"s{n}"
                history = histories.setdefault(session, [house_rules(tag, n)])
                item = turn * sessions + n + 1
                history.append(UserMessage(f"Turn {turn}: describe item number {item}."))
                req = ChatRequest(session=session, messages=history)
                completion = client.chat(req, events.append)
                history.append(AssistantMessage(completion.content))
                if session in last:
                    previous = prompt_tokens(last[session])
                    reuse.append((session, turn, completion.timings.cache_n, previous))
                last[session] = completion
    took = time.monotonic() - started
    short = [r for r in reuse if r[2] < REUSED * r[3]]
    assert short == [], f"turns that reused under 90 % of their previous prompt: {short}"
    assert len(reuse) == sessions * (turns - 1)
    # round robin over more sessions than slots: every later turn moved, and came back restored
    restored = [e for e in events if isinstance(e, SessionRestored)]
    assert len(restored) == sessions * (turns - 1), restored
    assert len([e for e in events if isinstance(e, SessionSaved)]) >= sessions * (turns - 1)
    assert len([e for e in events if isinstance(e, SessionMoved)]) == sessions * turns
    sizes = [prompt_tokens(c) for c in last.values()]
    assert all(1300 <= size <= 2000 for size in sizes), sizes
    print(f"\n{sessions} sessions x {turns} turns on {llama.SLOTS} slots: {took:.0f} s")
