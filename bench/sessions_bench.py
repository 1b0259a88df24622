"""Sessions that outnumber the slots, against the real llama-server through inferproxy: six
sessions of about 1,500 tokens take four turns each, round robin, on two slots, once as sessions
(the client places them and moves them through their checkpoints) and once as today's `slot=`
round robin (session n on slot n % 2), each on a fresh server with no prompt cache in RAM
(`--cache-ram 0`).

Per schedule: what a later turn reused of its session's previous prompt (`cache_n` against that
prompt's tokens, median), its first token (the call to the first content) as a ratio of the
median cold first turn's, and for sessions the median save and restore times from their events.
"""

from __future__ import annotations

import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "device"))

import llama  # noqa: E402
from proxy import ProxyProcess  # noqa: E402

from app.client import Client  # noqa: E402
from app.config import parse_config  # noqa: E402
from app.container import Container  # noqa: E402
from domain.completion import Completion  # noqa: E402
from domain.events import ChatEvent, Content, SessionRestored, SessionSaved  # noqa: E402
from domain.messages import (  # noqa: E402
    AssistantMessage,
    ChatMessage,
    ChatRequest,
    SystemMessage,
    UserMessage,
)

SESSIONS = 6
# The proxy's accept limit lifted: a moved turn makes a few small requests (a save, a render, a
# restore); the bench measures the cache, not the budget.
LIFTED = ("--burst", "10000", "--rate", "10000")


def client_on(socket_path: str) -> Client:
    config: dict[str, Any] = {
        "socket": socket_path,
        "model": llama.ALIAS,
        "limits": {"max_tokens": 8, "liveness_ms": 300_000},
        "sampling": {"temperature": 0.0, "seed": 42},
        "proxy": {"burst": 10000, "rate": 10000},
    }
    client: Client = Container(config=parse_config(config)).client()
    return client


def rules(tag: str) -> SystemMessage:
    """About 1,300 tokens of rules, the session's own from its first token: with its turns, a
    history of about 1,500 tokens."""
    lines = [_rule(i, colour, size) for i, (colour, size) in enumerate(_pairs(), 1)]
    return SystemMessage(f"Session {tag}.\n" + "\n".join(lines * 4))


def _rule(i: int, colour: str, size: str) -> str:
    return f"Rule {i}: when the user mentions item {i}, describe it as {colour} and {size}."


def _pairs() -> list[tuple[str, str]]:
    colours, sizes = ("red", "green", "blue", "amber", "violet"), ("small", "large", "round")
    return [(colour, size) for colour in colours for size in sizes]


class Schedule:
    """One round robin of `SESSIONS` sessions for `turns` turns, and what each turn measured."""

    def __init__(self, client: Client, *, sessions: bool) -> None:
        self.client = client
        self.sessions = sessions
        self.cold_s: list[float] = []
        self.later_s: list[float] = []
        self.reused: list[float] = []
        self.events: list[ChatEvent] = []

    def run(self, turns: int) -> None:
        tag = secrets.token_hex(4)
        histories: dict[int, list[ChatMessage]] = {}
        last: dict[int, Completion] = {}
        for turn in range(turns):
            for n in range(SESSIONS):
                history = histories.setdefault(n, [rules(f"{tag}-{n}")])
                item = turn * SESSIONS + n + 1
                history.append(UserMessage(f"Turn {turn}: describe item {item}."))
                req = (
                    ChatRequest(session=f"s{n}", messages=history)
                    if self.sessions
                    else ChatRequest(slot=n % llama.SLOTS, messages=history)
                )
                completion, seconds = self._turn(req)
                history.append(AssistantMessage(completion.content))
                if n in last:
                    previous = last[n].timings
                    prompt = previous.cache_n + previous.prompt_n
                    self.reused.append(completion.timings.cache_n / prompt)
                    self.later_s.append(seconds)
                else:
                    self.cold_s.append(seconds)
                last[n] = completion

    def _turn(self, req: ChatRequest) -> tuple[Completion, float]:
        started = time.perf_counter()
        first: list[float] = []

        def seen(event: ChatEvent) -> None:
            self.events.append(event)
            if not first and isinstance(event, Content):
                first.append(time.perf_counter() - started)

        completion = self.client.chat(req, seen)
        return completion, first[0] if first else time.perf_counter() - started

    def rows(self, name: str) -> list[tuple[str, str]]:
        cold, later = statistics.median(self.cold_s), statistics.median(self.later_s)
        ratio = later / cold
        rows = [
            (
                f"{name}: later turns reused of their previous prompt (median, min)",
                f"{statistics.median(self.reused) * 100:.0f} %, {min(self.reused) * 100:.0f} %",
            ),
            (
                f"{name}: later turn's first token / cold first turn's (median)",
                f"{ratio:.2f}x ({later * 1000:.0f} ms / {cold * 1000:.0f} ms)",
            ),
        ]
        saves = [e.ms for e in self.events if isinstance(e, SessionSaved)]
        restores = [e for e in self.events if isinstance(e, SessionRestored)]
        if saves and restores:
            size = statistics.median(e.bytes for e in restores) / 2**20
            restore_ms = statistics.median(e.ms for e in restores)
            rows.append(
                (
                    f"{name}: save / restore of a checkpoint (median)",
                    f"{statistics.median(saves):.0f} ms / {restore_ms:.0f} ms"
                    f" ({size:.0f} MiB, {len(saves)} saves, {len(restores)} restores)",
                )
            )
        return rows


def schedule(folder: Path, *, sessions: bool, turns: int) -> Schedule:
    with (
        llama.start_server("tools", log_dir=folder, extra_args=("--cache-ram", "0")) as server,
        ProxyProcess(f"{server.host}:{server.port}", extra_args=LIFTED) as proxy,
    ):
        measured = Schedule(client_on(proxy.socket_path), sessions=sessions)
        measured.run(turns)
        return measured


def run(quick: bool = False) -> list[tuple[str, str]]:
    turns = 2 if quick else 4
    folder = Path(tempfile.mkdtemp(prefix="inferpath-sessions-bench-"))
    pinned = schedule(folder / "slots", sessions=False, turns=turns)
    placed = schedule(folder / "sessions", sessions=True, turns=turns)
    title = f"{SESSIONS} sessions x {turns} turns on {llama.SLOTS} slots"
    return [
        (f"{title}, slot= round robin vs sessions", "(--cache-ram 0)"),
        *pinned.rows("slot= round robin"),
        *placed.rows("sessions"),
    ]


if __name__ == "__main__":
    from common import print_table

    print_table(run(quick="--quick" in sys.argv))
