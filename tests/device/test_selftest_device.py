"""`python -m app.selftest` through a real inferproxy against the real llama-server: all three
checks pass against the server the config describes, and the cache check fails, naming the cause
and the flags, against one started with a unified KV cache."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import llama
import pytest
from proxy import ProxyProcess

pytestmark = pytest.mark.device

CACHE_LOSS_TOKENS = 64  # the default limits.cache_loss_tokens
TOKEN_BUDGET = 1200  # the brief's "about 1,000 tokens" for the whole self-test, with some slack


@pytest.fixture
def proxy(tools_server: llama.LlamaServer) -> Iterator[ProxyProcess]:
    with ProxyProcess(f"{tools_server.host}:{tools_server.port}") as running:
        yield running


def write_config(
    path: Path,
    socket_path: str,
    *,
    sha: str | None,
    extra: str = "",
    n_ctx: int = llama.SLOT_CONTEXT,
    model: str = llama.ALIAS,
) -> Path:
    expect = (
        ""
        if sha is None
        else (f'[expect]\nchat_template_sha256 = "{sha}"\nn_ctx = {n_ctx}\ntotal_slots = {llama.SLOTS}\n')
    )
    prefill = llama.TOOL_PREFILL.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    path.write_text(
        f'socket = "{socket_path}"\nmodel = "{model}"\n{extra}'
        f'[sampling]\ntemperature = 0.0\nseed = 42\n{expect}[selftest]\ntool_prefill = "{prefill}"\n'
    )
    return path


def run_selftest(config: Path) -> tuple[int, list[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "app.selftest", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout.splitlines(), time.monotonic() - started


def cache_figures(line: str) -> tuple[int, int]:
    """(tokens reused, tokens turn 1 left in the slot) from the cache check's line."""
    found = re.search(r"reused (\d+) of (\d+) tokens", line)
    assert found is not None, line
    return int(found[1]), int(found[2])


def selftest_tokens(line: str) -> int:
    found = re.search(r", (\d+) tokens$", line)
    assert found is not None, line
    return int(found[1])


def template_sha(server: llama.LlamaServer) -> str:
    _, props = server.get_json("/props")
    return hashlib.sha256(props["chat_template"].encode("utf-8")).hexdigest()


def test_selftest_passes_all_three_checks_against_the_server_it_describes(
    tools_server: llama.LlamaServer, proxy: ProxyProcess, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "ok.toml", proxy.socket_path, sha=template_sha(tools_server))
    code, lines, _ = run_selftest(config)
    assert code == 0, "\n".join(lines)
    assert [line.split()[0] for line in lines] == ["ok", "ok", "ok", "ok"]
    assert lines[0].startswith("ok   props:")
    assert lines[1].startswith("ok   tool call: get_time(")
    assert lines[2].startswith("ok   cache: turn 2 reused")
    assert "after a request on slot 1" in lines[2] and "likely cause" not in lines[2]
    assert "3/3 checks passed" in lines[3]
    # Turn 1 is long enough that a miss would show: more than twice the loss limit in the slot.
    cached, left = cache_figures(lines[2])
    assert left > 2 * CACHE_LOSS_TOKENS
    assert left - cached <= CACHE_LOSS_TOKENS
    assert selftest_tokens(lines[3]) <= TOKEN_BUDGET


def test_selftest_fails_the_cache_check_when_turn_1_is_too_short_for_the_loss_limit(
    tools_server: llama.LlamaServer, proxy: ProxyProcess, tmp_path: Path
) -> None:
    # Under a loss limit as long as the whole exchange, a total miss would pass: the check says so.
    limits = f"[limits]\ncache_loss_tokens = {TOKEN_BUDGET}\n"
    config = write_config(tmp_path / "loose.toml", proxy.socket_path, sha=template_sha(tools_server), extra=limits)
    code, lines, _ = run_selftest(config)
    assert code == 1, "\n".join(lines)
    assert lines[2].startswith("FAIL cache: turn 1 left only ")
    assert f"twice the loss limit {TOKEN_BUDGET}" in lines[2]
    assert lines[3].startswith("FAIL selftest: 2/3")


def test_selftest_fails_with_a_clear_line_when_expect_is_wrong(
    tools_server: llama.LlamaServer, proxy: ProxyProcess, tmp_path: Path
) -> None:
    wrong = "0" * 64
    config = write_config(tmp_path / "wrong.toml", proxy.socket_path, sha=wrong)
    code, lines, _ = run_selftest(config)
    assert code == 1
    assert lines[0].startswith("FAIL props: chat_template sha256 ")
    assert template_sha(tools_server) in lines[0] and wrong in lines[0]
    assert lines[-1].startswith("FAIL selftest: 2/3")


def test_selftest_without_expect_refuses_to_run(proxy: ProxyProcess, tmp_path: Path) -> None:
    code, lines, _ = run_selftest(write_config(tmp_path / "none.toml", proxy.socket_path, sha=None))
    assert code == 2
    assert lines == [lines[0]] and "needs an [expect] section" in lines[0]


def test_selftest_against_a_dead_socket_fails_within_the_configured_waits(tmp_path: Path) -> None:
    dead = str(tmp_path / "nobody.sock")
    retry = "[retry]\nattempts = 2\ndelays_ms = [100]\n"
    code, lines, seconds = run_selftest(write_config(tmp_path / "dead.toml", dead, sha="1" * 64, extra=retry))
    assert code == 1
    assert lines[0].startswith("FAIL props: ConnectError") and dead in lines[0]
    assert lines[1].startswith("FAIL tool call: not run")
    assert seconds < 30


def test_selftest_fails_the_cache_check_naming_the_cause_against_a_server_with_a_unified_kv_cache(
    tmp_path: Path,
) -> None:
    # `--kv-unified` after the preset's `--no-kv-unified` wins: one KV buffer for both slots, and
    # every idle slot is emptied (saved to the RAM cache) when another slot starts a task.
    with (
        llama.start_server("tools", extra_args=("--kv-unified",)) as server,
        ProxyProcess(f"{server.host}:{server.port}") as proxy,
    ):
        _, props = server.get_json("/props")
        assert props["default_generation_settings"]["n_ctx"] == llama.CONTEXT  # the tell: the whole -c per slot
        assert props["total_slots"] == llama.SLOTS
        config = write_config(
            tmp_path / "unified.toml", proxy.socket_path, sha=template_sha(server), n_ctx=llama.CONTEXT
        )
        code, lines, _ = run_selftest(config)
    assert code == 1, "\n".join(lines)
    assert lines[0].startswith("ok   props:")
    assert lines[1].startswith("ok   tool call:")
    assert lines[2].startswith("FAIL cache: turn 2 reused "), lines[2]
    assert "after a request on slot 1" in lines[2]
    cached, left = cache_figures(lines[2])
    assert left - cached > CACHE_LOSS_TOKENS
    assert "a unified KV cache (started without -np, or with --kv-unified" in lines[2]
    assert lines[2].endswith("start it with -np N --no-kv-unified")
    assert lines[3].startswith("FAIL selftest: 2/3")
    print(lines[2])
