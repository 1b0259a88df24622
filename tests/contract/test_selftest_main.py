"""`python -m app.selftest` as its `main`, against the scripted fake server on a Unix socket: the
exit code (0 all pass, 1 a check fails, 2 it could not run) and exactly the lines it prints, with
never a traceback. The server answers each chat by what the request holds (tools: the tool-call
check; slot 1: the short request on another slot between the cache turns; two messages: turn 1 of
the cache check; four: turn 2)."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

import pytest

from adapters.fake_server import End, FakeServer, Raw, RecordedRequest, error_reply, json_reply, sse_reply
from adapters.fake_server.script import Script
from app import selftest, selftest_checks
from client_support import CHAT, PROPS, ROLE, chunk, recorded

pytestmark = pytest.mark.timeout(10)

TEMPLATE = "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
TEMPLATE_SHA = hashlib.sha256(TEMPLATE.encode("utf-8")).hexdigest()
PROPS_ANSWER = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2, "chat_template": TEMPLATE}
CALL = {
    "index": 0,
    "id": "X3kXjv1zQ5sA9gJ0mRr2cTn7bYw4pLdE",
    "type": "function",
    "function": {"name": "get_time", "arguments": '{"city": "Paris"}'},
}
TOOL = [
    chunk(ROLE, n=0, prompt_n=150),
    chunk({"tool_calls": [CALL]}, n=5, prompt_n=150),
    chunk(finish="tool_calls", n=6, prompt_n=150),
]


def text_answer(text: str, *, cache_n: int, prompt_n: int, n: int = 6) -> list[dict[str, Any]]:
    return [
        chunk({"content": text}, n=n, cache_n=cache_n, prompt_n=prompt_n),
        chunk(finish="stop", n=n, cache_n=cache_n, prompt_n=prompt_n),
    ]


TURN1 = text_answer("The sky is blue.", cache_n=3, prompt_n=380)  # leaves 389 tokens in the slot
HIT = text_answer("Grass is green.", cache_n=388, prompt_n=20)
MISS = text_answer("Grass is green.", cache_n=3, prompt_n=405)
OTHER = text_answer("Yes.", cache_n=0, prompt_n=12, n=4)


def serve(server: FakeServer, *, turn2: list[dict[str, Any]] = HIT, props: Script | None = None) -> None:
    def chat(request: RecordedRequest) -> Script:
        body = request.json()
        if "tools" in body:
            return sse_reply(TOOL)
        if body["id_slot"] == 1:
            return sse_reply(OTHER)
        return sse_reply(TURN1 if len(body["messages"]) == 2 else turn2)

    server.route(*PROPS, props or json_reply(PROPS_ANSWER))
    server.route(*CHAT, chat)


def config_file(tmp_path: Path, socket_path: str, *, expect: bool = True) -> str:
    text = (
        f'socket = "{socket_path}"\n'
        "[limits]\npoll_ms = 100\nload_wait_ms = 150\nbusy_wait_ms = 150\nidle_grace_ms = 150\nliveness_ms = 200\n"
        "[retry]\nattempts = 2\ndelays_ms = [50]\njitter = 0.0\n"
    )
    if expect:
        text += f'[expect]\nchat_template_sha256 = "{TEMPLATE_SHA}"\nn_ctx = 4096\ntotal_slots = 2\n'
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def run_main(config: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], float]:
    started = time.monotonic()
    code = selftest.main(["--config", config])
    seconds = time.monotonic() - started
    out, err = capsys.readouterr()
    assert "Traceback" not in out and "Traceback" not in err
    assert err == ""
    return code, out.splitlines(), seconds


def summary(passed: int) -> str:
    verdict = "ok  " if passed == 3 else "FAIL"
    return rf"{verdict} selftest: {passed}/3 checks passed in \d+\.\d s, \d+ tokens"


def test_main_exits_0_and_prints_four_ok_lines_when_every_check_passes(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(server)

    code, lines, _ = run_main(config_file(tmp_path, server.socket_path), capsys)

    assert code == 0
    assert lines[:3] == [
        f"ok   props: chat_template sha256 {TEMPLATE_SHA} == expected, n_ctx 4096 == expected, "
        "total_slots 2 == expected",
        'ok   tool call: get_time({"city": "Paris"}) parsed, finish_reason tool_calls, 156 tokens',
        "ok   cache: turn 2 reused 388 of 389 tokens (loss limit 64) after a request on slot 1, 428 tokens",
    ]
    assert re.fullmatch(summary(3).replace(r"\d+ tokens", "584 tokens"), lines[3])
    assert len(lines) == 4
    chats = [r.json() for r in recorded(server, CHAT)]
    cap, other_cap = selftest_checks.MAX_TOKENS, selftest_checks.OTHER_MAX_TOKENS
    assert [(body["id_slot"], body["max_tokens"]) for body in chats] == [(0, cap), (0, cap), (1, other_cap), (0, cap)]


def test_main_exits_1_when_turn_2_misses_the_cache(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(server, turn2=MISS)

    code, lines, _ = run_main(config_file(tmp_path, server.socket_path), capsys)

    assert code == 1
    assert lines[2] == (
        "FAIL cache: turn 2 reused 3 of 389 tokens (loss limit 64) after a request on slot 1, 813 tokens; "
        "likely cause: the server empties idle slots whenever another slot starts a task, as it does with a "
        "unified KV cache (started without -np, or with --kv-unified; its per-slot n_ctx in /props is then the "
        "whole -c); start it with -np N --no-kv-unified"
    )
    assert re.fullmatch(summary(2), lines[3])


def test_main_exits_1_with_fail_lines_when_the_server_answers_errors(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.route(*PROPS, json_reply(["not", "props"]))
    server.route(*CHAT, error_reply(400, "the request exceeds the available context size", "exceed_context_size_error"))

    code, lines, _ = run_main(config_file(tmp_path, server.socket_path), capsys)

    assert code == 1
    assert lines[0].startswith("FAIL props: ProtocolError: /props")
    assert lines[1].startswith("FAIL tool call: HttpError: HTTP 400: ")
    assert lines[2].startswith("FAIL cache: HttpError: HTTP 400: ")
    assert re.fullmatch(summary(0), lines[3])


def test_main_against_a_missing_socket_exits_1_fast_and_runs_nothing_after_props(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = str(tmp_path / "nobody.sock")

    code, lines, seconds = run_main(config_file(tmp_path, dead), capsys)

    assert code == 1
    assert lines[0].startswith("FAIL props: ConnectError: ") and dead in lines[0]
    assert lines[1:3] == [
        "FAIL tool call: not run: the server is unreachable (ConnectError)",
        "FAIL cache: not run: the server is unreachable (ConnectError)",
    ]
    assert re.fullmatch(summary(0).replace(r"\d+ tokens", "0 tokens"), lines[3])
    assert seconds < 1.0


def test_main_without_expect_exits_2_before_connecting(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(server)

    code, lines, _ = run_main(config_file(tmp_path, server.socket_path, expect=False), capsys)

    assert code == 2
    assert len(lines) == 1
    assert lines[0].startswith("FAIL config: ") and "needs an [expect] section" in lines[0]
    assert server.requests == []


def test_main_against_a_proxy_whose_server_is_down_stops_after_the_first_failed_check(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A proxy in front of a stopped server accepts and closes every connection before any byte:
    # once a check has failed that way through all its retries, the others are not run.
    server.route(*PROPS, Raw((), End.CLOSE))
    server.route(*CHAT, Raw((), End.CLOSE))

    code, lines, seconds = run_main(config_file(tmp_path, server.socket_path), capsys)

    assert code == 1
    # A close at once is what a proxy does to a refused connection too: the bytes are the same.
    assert lines[0].startswith("FAIL props: ProxyRefused: ")
    assert "the server behind the socket is down or restarting" in lines[0]
    assert lines[1:3] == [
        "FAIL tool call: not run: the server cuts its connections short (ProxyRefused)",
        "FAIL cache: not run: the server cuts its connections short (ProxyRefused)",
    ]
    assert len(recorded(server, CHAT)) == 0
    assert seconds < 1.0
