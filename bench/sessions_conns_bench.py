"""Concurrent sessions through an inferproxy with its defaults (8 connections, a burst of 10, then
2 a second), in front of the real llama-server with a slot per session: what the proxy refused
and what the client retried.

4 and 8 sessions, each on a slot of its own, run 3 turns at once on threads, every turn a
`chat_with_retry` with `[cache] predict = true` (from the second turn on, three requests before
the chat: `/apply-template`, `/tokenize`, `/slots`). Counted: the proxy's refusals (its log
lines: one per refusal, then a summary a second), the client's retries (`Retrying` events), the
sessions that failed, those still running after `STUCK_S` (a deadlock), and the predictions made
of those asked (a refused prediction request is dropped silently: the turn goes on without one).

    python bench/sessions_conns_bench.py [--quick]

Run it with another checkout's `src` first on `PYTHONPATH` to measure that code (the proxy
starts from the same path).
"""

from __future__ import annotations

import io
import re
import sys
import tempfile
import threading
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
from domain.errors import InferError  # noqa: E402
from domain.events import CachePrediction, ChatEvent, Retrying  # noqa: E402
from domain.messages import (  # noqa: E402
    AssistantMessage,
    ChatMessage,
    ChatRequest,
    SystemMessage,
    UserMessage,
)

SLOTS = 8
TURNS = 3
STUCK_S = 300.0  # a session still running this long after the others began is taken as stuck
REFILL_WAIT_S = 6.0  # the proxy's bucket full again (10 tokens at 2 a second) between runs
QUESTIONS = ("Name one colour of the sky.", "Now name one colour of grass.", "And one of snow?")
_SUMMARY = re.compile(r"refused (\d+) more connections?")


class Lines(io.StringIO):
    """The proxy's lines after its start line, kept as they come (from its copying thread)."""

    def refusals(self) -> int:
        count = 0
        for line in self.getvalue().splitlines():
            if "refused a connection" in line:  # (after the proxy's "inferproxy: ")
                count += 1
            elif (match := _SUMMARY.search(line)) is not None:
                count += int(match[1])
        return count


def client_on(socket_path: str, max_tokens: int) -> Client:
    config: dict[str, Any] = {
        "socket": socket_path,
        "model": llama.ALIAS,
        "limits": {"max_tokens": max_tokens, "liveness_ms": 120_000},
        "sampling": {"temperature": 0.0, "seed": 42},
        "cache": {"predict": True},
        "expect": {"chat_template_sha256": "0" * 64, "n_ctx": 2048, "total_slots": SLOTS},
    }
    client: Client = Container(config=parse_config(config)).client()
    return client


def session(
    client: Client,
    slot: int,
    retries: list[Retrying],
    predicted: list[int],
    failures: list[str],
) -> None:
    rules = SystemMessage(f"Session {slot}. You are terse. Answer in a few words.")
    messages: list[ChatMessage] = [rules]

    def seen(event: ChatEvent) -> None:
        if isinstance(event, Retrying):
            retries.append(event)
        elif isinstance(event, CachePrediction):
            predicted.append(slot)

    try:
        for question in QUESTIONS[:TURNS]:
            messages.append(UserMessage(question))
            req = ChatRequest(slot=slot, messages=tuple(messages))
            completion = client.chat_with_retry(req, seen)
            messages.append(AssistantMessage(completion.content))
    except InferError as exc:
        failures.append(f"slot {slot}: {type(exc).__name__}: {exc}")


def sessions(socket_path: str, count: int, max_tokens: int) -> dict[str, Any]:
    client = client_on(socket_path, max_tokens)  # a fresh container: its budget starts full
    retries: list[Retrying] = []
    predicted: list[int] = []
    failures: list[str] = []
    threads = [
        threading.Thread(
            target=session,
            args=(client, slot, retries, predicted, failures),
            daemon=True,
        )
        for slot in range(count)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, started + STUCK_S - time.monotonic()))
    stuck = sum(thread.is_alive() for thread in threads)
    return {
        "retries": len(retries),
        "predicted": len(predicted),
        "asked": count * (TURNS - 1),  # every turn but the first asks for one
        "failures": failures,
        "stuck": stuck,
        "took_s": time.monotonic() - started,
        "first_retry": retries[0].error[:160] if retries else "",
    }


def run(quick: bool = False) -> list[tuple[str, str]]:
    max_tokens = 8 if quick else 24
    rows: list[tuple[str, str]] = []
    folder = Path(tempfile.mkdtemp(prefix="inferpath-sessions-bench-"))
    lines = Lines()
    with (
        llama.start_server("tools", log_dir=folder, slots=SLOTS, context=SLOTS * 2048) as server,
        ProxyProcess(f"{server.host}:{server.port}", echo=lines) as proxy,  # the proxy's defaults
    ):
        for count in (4, 8):
            time.sleep(REFILL_WAIT_S)  # the proxy's bucket full, as after a quiet spell
            before, seen = lines.refusals(), len(lines.getvalue())
            result = sessions(proxy.socket_path, count, max_tokens)
            time.sleep(1.5)  # the proxy's summary of the last second's refusals, if any
            refused = lines.refusals() - before
            figure = (
                f"{refused} refused, {result['retries']} retries, {len(result['failures'])} failed,"
                f" {result['stuck']} stuck, {result['predicted']}/{result['asked']} predictions"
                f" ({result['took_s']:.1f} s)"
            )
            rows.append((f"{count} sessions x {TURNS} predicted turns, default proxy", figure))
            for line in lines.getvalue()[seen:].splitlines()[:3]:
                print(f"  {line}", file=sys.stderr)
            for failure in result["failures"][:2]:
                print(f"  {failure[:200]}", file=sys.stderr)
            if result["first_retry"]:
                print(f"  first retry after: {result['first_retry']}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    for name, value in run(quick="--quick" in sys.argv):
        print(f"{name}: {value}")
