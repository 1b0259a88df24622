"""The cache prediction against the real llama-server, through inferproxy: what it costs a turn,
and how far it is from the `cache_n` the server then reports.

- Cost: two clients on one proxy, `[cache] predict` on and off, each running two-turn sessions
  (the second turn extends the first) in alternation; the time from the call to the second turn's
  first token, median over the rounds, and the difference. Beside it, the three requests the
  prediction makes (`/apply-template`, `/tokenize`, `/slots`) sent straight to the server for a
  short and a 3,000-token conversation.
- Error: |predicted - cache_n| over the four cases of the device tests (an extension, a changed
  system prompt, reasoning the Qwen3.5 template drops, a slot a unified KV cache emptied).
"""

from __future__ import annotations

import http.client
import json
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
from domain.events import CachePrediction, ChatEvent, Content, Reasoning  # noqa: E402
from domain.messages import AssistantMessage, ChatMessage, ChatRequest, SystemMessage, UserMessage  # noqa: E402

# Each predicted turn opens three more connections; the proxy's token bucket (a burst of 10, 2 a
# second) would refuse some at a bench's pace, so it is lifted here.
PREDICTED_AFTER: list[float] = []  # seconds from the call to its CachePrediction
LIFTED = ("--burst", "10000", "--rate", "10000")
ASK = UserMessage("Name one colour of the sky.")
NEXT = UserMessage("Now name one colour of grass.")


def client_on(socket_path: str, *, predict: bool, max_tokens: int = 16) -> Client:
    config: dict[str, Any] = {
        "socket": socket_path,
        "model": llama.ALIAS,
        "limits": {"max_tokens": max_tokens, "liveness_ms": 120_000},
        "sampling": {"temperature": 0.0, "seed": 42},
        "cache": {"predict": predict},
        "proxy": {"burst": 10000, "rate": 10000},  # the lifted proxy's own (LIFTED)
    }
    client: Client = Container(config=parse_config(config)).client()
    return client


def system(text: str = "You are a terse assistant. Answer in one short sentence. ", times: int = 6) -> SystemMessage:
    return SystemMessage(f"Session {secrets.token_hex(4)}. " + text * times)


def turn(
    client: Client, messages: list[ChatMessage], *, slot: int = 0, thinking: bool = False
) -> tuple[Completion, float, CachePrediction | None]:
    started = time.perf_counter()
    first: list[float] = []
    predicted: list[CachePrediction] = []

    def seen(event: ChatEvent) -> None:
        if isinstance(event, CachePrediction):
            predicted.append(event)
            PREDICTED_AFTER.append(time.perf_counter() - started)
        elif not first and isinstance(event, Content | Reasoning):
            first.append(time.perf_counter() - started)

    completion = client.chat(ChatRequest(slot=slot, messages=messages, thinking=thinking), seen)
    return completion, first[0] if first else time.perf_counter() - started, predicted[0] if predicted else None


def answer(completion: Completion) -> AssistantMessage:
    return AssistantMessage(completion.content, completion.reasoning_content)


def second_turn(client: Client, slot: int) -> float:
    rules = system()
    first, _, _ = turn(client, [rules, ASK], slot=slot)
    _, seconds, _ = turn(client, [rules, ASK, answer(first), NEXT], slot=slot)
    return seconds


def post(server: llama.LlamaServer, path: str, body: bytes) -> bytes:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    data = conn.getresponse().read()
    conn.close()
    return data


def prediction_requests(server: llama.LlamaServer, client: Client, messages: list[ChatMessage], rounds: int) -> float:
    """Median ms of the prediction's three requests for `messages`, sent straight to the server."""
    body = client.render(ChatRequest(slot=0, messages=messages))
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        prompt = json.loads(post(server, "/apply-template", body))["prompt"]
        post(server, "/tokenize", json.dumps({"content": prompt}).encode())
        conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        conn.request("GET", "/slots")
        conn.getresponse().read()
        conn.close()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def errors(socket_path: str, slot: int, cases: int, *, unified: bool = False) -> list[int]:
    client = client_on(socket_path, predict=True, max_tokens=24)
    out = []
    for _ in range(cases):
        rules = system()
        first, _, _ = turn(client, [rules, ASK], slot=slot)
        if unified:
            turn(client, [UserMessage("Hi.")], slot=1 - slot)
        again = [rules, ASK, answer(first), NEXT]
        if not unified:
            out.append(_error(turn(client, again, slot=slot)))
            changed = [system("You are a verbose assistant who likes long answers. "), ASK, answer(first), NEXT]
            out.append(_error(turn(client, changed, slot=slot)))
        else:
            out.append(_error(turn(client, again, slot=slot)))
    return out


def reasoning_errors(socket_path: str, cases: int) -> list[int]:
    client = client_on(socket_path, predict=True, max_tokens=120)
    out = []
    for _ in range(cases):
        rules = system()
        story = UserMessage(llama.LONG_STORY_PROMPT)
        first, _, _ = turn(client, [rules, story], thinking=True)
        out.append(_error(turn(client, [rules, story, answer(first), NEXT], thinking=True)))
    return out


def long_rules() -> SystemMessage:
    return SystemMessage(llama.house_rules(secrets.token_hex(4)))


def after_restart(folder: Path, *, checkpoint: bool) -> tuple[float, float, int]:
    """A 3,000-token session, the server restarted after turn 1 (with a checkpoint saved first,
    or not): the cold turn's and the next turn's seconds to the first token, and the next
    turn's cache_n."""
    saves = folder / "slots"
    server = llama.launch("tools", log_dir=folder, slot_save_path=saves)
    try:
        with ProxyProcess(f"{server.host}:{server.port}", extra_args=LIFTED) as proxy:
            client = client_on(proxy.socket_path, predict=True)
            rules = long_rules()
            cold, cold_s, _ = turn(client, [rules, ASK])
            if checkpoint:
                assert client.save_slot(0) is not None
            port = server.port
            server.stop()
            server = llama.launch("tools", log_dir=folder, slot_save_path=saves, port=port)
            warm, warm_s, _ = turn(client, [rules, ASK, answer(cold), NEXT])
    finally:
        server.stop()
    return cold_s, warm_s, warm.timings.cache_n


def _error(result: tuple[Completion, float, CachePrediction | None]) -> int:
    completion, _, prediction = result
    assert prediction is not None
    return prediction.reused - completion.timings.cache_n


def run(quick: bool = False) -> list[tuple[str, str]]:
    rounds = 6 if quick else 20
    cases = 1 if quick else 3
    folder = Path(tempfile.mkdtemp(prefix="inferpath-cache-bench-"))
    rows: list[tuple[str, str]] = []
    with (
        llama.start_server("tools", log_dir=folder / "tools") as server,
        ProxyProcess(f"{server.host}:{server.port}", extra_args=LIFTED) as proxy,
    ):
        on = client_on(proxy.socket_path, predict=True)
        off = client_on(proxy.socket_path, predict=False)
        with_prediction, without = [], []
        del PREDICTED_AFTER[:]
        for index in range(rounds):  # the slots alternate too
            without.append(second_turn(off, index % 2))
            with_prediction.append(second_turn(on, 1 - index % 2))
        rows.append(("the call to its CachePrediction (median)", f"{statistics.median(PREDICTED_AFTER) * 1000:.1f} ms"))
        cost = (statistics.median(with_prediction) - statistics.median(without)) * 1000
        rows.append(
            ("second turn, call to first token, prediction off (median)", f"{statistics.median(without) * 1000:.1f} ms")
        )
        rows.append(
            (
                "second turn, call to first token, prediction on (median)",
                f"{statistics.median(with_prediction) * 1000:.1f} ms",
            )
        )
        rows.append(("what the prediction adds to a turn", f"{cost:+.1f} ms ({rounds} rounds each)"))
        short = [system(), ASK, AssistantMessage("Blue."), NEXT]
        long = [system(times=260), ASK, AssistantMessage("Blue."), NEXT]
        tokens = len(
            on.tokenize(json.loads(post(server, "/apply-template", on.render(ChatRequest(0, long))))["prompt"])
        )
        rows.append(
            (
                "its three requests, straight to the server, short conversation",
                f"{prediction_requests(server, on, short, rounds):.1f} ms",
            )
        )
        rows.append(
            (
                f"its three requests, {tokens}-token conversation",
                f"{prediction_requests(server, on, long, rounds):.1f} ms",
            )
        )
        found = errors(proxy.socket_path, 0, cases)
    with (
        llama.start_server("thinking", log_dir=folder / "thinking") as server,
        ProxyProcess(f"{server.host}:{server.port}", extra_args=LIFTED) as proxy,
    ):
        found += reasoning_errors(proxy.socket_path, cases)
    with (
        llama.start_server("tools", log_dir=folder / "unified", extra_args=("--kv-unified",)) as server,
        ProxyProcess(f"{server.host}:{server.port}", extra_args=LIFTED) as proxy,
    ):
        found += errors(proxy.socket_path, 0, cases, unified=True)
    if not quick:
        cold, warm, cached = after_restart(folder / "restored", checkpoint=True)
        rows.append(
            (
                "3,000-token session after a restart, from its checkpoint",
                f"first token {warm:.2f} s ({warm / cold:.2f}x the cold {cold:.2f} s), {cached} cached",
            )
        )
        cold, warm, cached = after_restart(folder / "cold", checkpoint=False)
        rows.append(
            (
                "the same without a checkpoint",
                f"first token {warm:.2f} s ({warm / cold:.2f}x the cold {cold:.2f} s), {cached} cached",
            )
        )
    exact = sum(1 for e in found if e == 0)
    rows.append(
        (
            "prediction - cache_n over the four cases",
            f"{exact} of {len(found)} exact, largest |error| {max(abs(e) for e in found)} tokens",
        )
    )
    return rows


if __name__ == "__main__":
    from common import print_table

    print_table(run(quick="--quick" in sys.argv))
