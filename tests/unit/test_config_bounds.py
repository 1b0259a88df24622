"""`parse_config`: the code's defaults are the brief's, and a value that would fail later is refused now.

Every bound is asserted with its literal number, so a change to one is a change to a test too.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config import Config, ConfigError, Expect, Limits, Retry, Sampling, SelfTest, parse_config

MAX_MS = 604_800_000  # 7 days
INT32_MAX = 2_147_483_647
UINT32_MAX = 4_294_967_295
GIB = 1_073_741_824


def refusal(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.toml")
    return str(info.value)


def with_section(section: str, **values: Any) -> dict[str, Any]:
    return {"socket": "/tmp/infer.sock", section: values}


# --- defaults -------------------------------------------------------------------------------------


def test_limits_defaults_are_the_briefs_field_by_field() -> None:
    assert Limits().model_dump() == {
        "poll_ms": 5000,
        "busy_wait_ms": 600_000,
        "load_wait_ms": 180_000,
        "idle_grace_ms": 30_000,
        "liveness_ms": 30_000,
        "thinking_cap": 4096,
        "thinking_overrun": 256,
        "max_tokens": 8192,
        "queue_per_slot": 8,
        "header_bytes": 16384,
        "sse_line_bytes": 1048576,
        "body_bytes": 4194304,
        "error_body_bytes": 4096,
        "answer_bytes": 16777216,
        "tool_calls": 128,
        "cache_loss_tokens": 64,
    }


def test_retry_sampling_and_selftest_defaults_are_the_briefs_field_by_field() -> None:
    assert Retry().model_dump() == {
        "attempts": 4,
        "delays_ms": (2000, 8000, 30000),
        "jitter": 0.25,
        "total_ms": 300_000,
    }
    assert Sampling().model_dump() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": -1}
    assert SelfTest().model_dump() == {"tool_prefill": ""}


def test_a_config_with_only_a_socket_gets_every_section_default() -> None:
    cfg = Config(socket="/tmp/infer.sock")
    assert cfg.socket == "/tmp/infer.sock"
    assert cfg.model == "default"
    assert cfg.limits == Limits()
    assert cfg.retry == Retry()
    assert cfg.sampling == Sampling()
    assert cfg.selftest == SelfTest()
    assert cfg.expect is None


# --- bounds ---------------------------------------------------------------------------------------

MS_KEYS = [("limits", name) for name in Limits.model_fields if name.endswith("_ms")] + [("retry", "total_ms")]
TOKEN_KEYS = ["thinking_cap", "thinking_overrun", "max_tokens", "cache_loss_tokens"]
BYTE_KEYS = ["header_bytes", "sse_line_bytes", "body_bytes", "error_body_bytes", "answer_bytes"]


def test_the_ms_keys_are_the_five_waits_and_the_retry_budget() -> None:
    # Guards the parametrisation below against silently testing fewer keys.
    assert len(MS_KEYS) == 6


def test_the_longest_wait_fits_thread_waits_and_poll_milliseconds() -> None:
    # A lock that is free returns at once, but the timeout is still range-checked.
    lock = threading.Lock()
    assert lock.acquire(timeout=MAX_MS / 1000)
    lock.release()
    assert MAX_MS / 1000 <= threading.TIMEOUT_MAX
    assert MAX_MS <= INT32_MAX  # poll() takes int milliseconds


@pytest.mark.parametrize(("section", "key"), MS_KEYS)
def test_every_ms_key_loads_up_to_seven_days(section: str, key: str) -> None:
    cfg = parse_config(with_section(section, **{key: MAX_MS}))
    assert getattr(getattr(cfg, section), key) == MAX_MS


@pytest.mark.parametrize("value", [MAX_MS + 1, 2**63 - 1, 2**63, 2**200])
@pytest.mark.parametrize(("section", "key"), MS_KEYS)
def test_every_ms_key_past_seven_days_is_refused(section: str, key: str, value: int) -> None:
    message = refusal(with_section(section, **{key: value}))
    assert f"{section}.{key}: Input should be less than or equal to 604800000" in message


def test_retry_delays_past_seven_days_are_refused() -> None:
    assert parse_config(with_section("retry", delays_ms=[0, MAX_MS, 1])).retry.delays_ms == (0, MAX_MS, 1)
    message = refusal(with_section("retry", delays_ms=[1, 2**63, 3]))
    assert "retry.delays_ms.1: Input should be less than or equal to 604800000" in message


@pytest.mark.parametrize("key", TOKEN_KEYS)
def test_token_counts_fit_llama_servers_int32(key: str) -> None:
    assert getattr(parse_config(with_section("limits", **{key: INT32_MAX})).limits, key) == INT32_MAX
    message = refusal(with_section("limits", **{key: INT32_MAX + 1}))
    assert f"limits.{key}: Input should be less than or equal to 2147483647" in message


@pytest.mark.parametrize("key", BYTE_KEYS)
def test_byte_caps_stop_at_one_gib(key: str) -> None:
    assert getattr(parse_config(with_section("limits", **{key: GIB})).limits, key) == GIB
    message = refusal(with_section("limits", **{key: GIB + 1}))
    assert f"limits.{key}: Input should be less than or equal to 1073741824" in message


# The least each cap may be: llama-server's response head, an event line, a `/props` answer with
# its chat template, a short answer must fit (the recorded head is 172 bytes, the longest line 626).
FLOORS = {"header_bytes": 1024, "sse_line_bytes": 4096, "body_bytes": 65536, "answer_bytes": 4096}


@pytest.mark.parametrize(("key", "floor"), FLOORS.items())
def test_a_byte_cap_too_small_for_what_llama_server_sends_is_refused(key: str, floor: int) -> None:
    assert getattr(parse_config(with_section("limits", **{key: floor})).limits, key) == floor
    for small in (1, floor - 1):
        message = refusal(with_section("limits", **{key: small}))
        assert f"limits.{key}: Input should be greater than or equal to {floor}" in message


def test_the_error_body_kept_may_be_as_small_as_one_byte() -> None:
    assert parse_config(with_section("limits", error_body_bytes=1)).limits.error_body_bytes == 1


def test_queue_per_slot_stops_at_1024() -> None:
    assert parse_config(with_section("limits", queue_per_slot=1024)).limits.queue_per_slot == 1024
    message = refusal(with_section("limits", queue_per_slot=1025))
    assert "limits.queue_per_slot: Input should be less than or equal to 1024" in message


def test_retry_attempts_stop_at_100() -> None:
    cfg = parse_config(with_section("retry", attempts=100, delays_ms=[1] * 99, total_ms=1))
    assert cfg.retry.attempts == 100
    message = refusal(with_section("retry", attempts=101, delays_ms=[1] * 100))
    assert "retry.attempts: Input should be less than or equal to 100" in message


@pytest.mark.parametrize("seed", [-1, 0, 42, UINT32_MAX])
def test_seed_is_minus_one_or_a_uint32(seed: int) -> None:
    # llama-server keeps the seed in a uint32_t; -1 arrives there as 0xFFFFFFFF, its "random".
    assert parse_config(with_section("sampling", seed=seed)).sampling.seed == seed


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        (-2, "sampling.seed: Input should be greater than or equal to -1"),
        (UINT32_MAX + 1, "sampling.seed: Input should be less than or equal to 4294967295"),
    ],
)
def test_a_seed_the_server_would_wrap_is_refused(seed: int, expected: str) -> None:
    assert expected in refusal(with_section("sampling", seed=seed))


def test_top_k_fits_int32() -> None:
    assert parse_config(with_section("sampling", top_k=INT32_MAX)).sampling.top_k == INT32_MAX
    message = refusal(with_section("sampling", top_k=INT32_MAX + 1))
    assert "sampling.top_k: Input should be less than or equal to 2147483647" in message


@pytest.mark.parametrize("key", ["n_ctx", "total_slots"])
def test_expect_counts_fit_int32(key: str) -> None:
    expect = {"chat_template_sha256": "ab" * 32, "n_ctx": 4096, "total_slots": 4}
    cfg = parse_config({"socket": "s", "expect": {**expect, key: INT32_MAX}})
    assert isinstance(cfg.expect, Expect)
    assert getattr(cfg.expect, key) == INT32_MAX
    message = refusal({"socket": "s", "expect": {**expect, key: INT32_MAX + 1}})
    assert f"expect.{key}: Input should be less than or equal to 2147483647" in message


# --- floats ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key"),
    [("sampling", "temperature"), ("sampling", "top_p"), ("sampling", "min_p"), ("retry", "jitter")],
)
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_floats_are_refused(section: str, key: str, value: float) -> None:
    assert f"{section}.{key}: Input should be a finite number" in refusal(with_section(section, **{key: value}))


def test_temperature_has_no_sane_ceiling_but_must_fit_a_c_float() -> None:
    # llama-server accepts any non-negative temperature, in a C float: past its range it is inf.
    assert parse_config(with_section("sampling", temperature=1e38)).sampling.temperature == 1e38
    message = refusal(with_section("sampling", temperature=1e39))
    assert "sampling.temperature: is past 3.402823e+38, the largest value of the C float" in message


# --- strings --------------------------------------------------------------------------------------


def test_a_nul_in_the_socket_path_is_refused() -> None:
    # The C string would end at the NUL and the request go to /tmp/a, another socket.
    message = refusal({"socket": "/tmp/a\x00b"})
    assert "socket: contains a NUL character (at character 6)" in message


def test_a_socket_path_fits_sun_path_in_bytes_not_characters() -> None:
    fits = "/tmp/" + "x" * 102
    assert parse_config({"socket": fits}).socket == fits
    # 54 two-byte characters: 113 bytes, though only 59 characters.
    message = refusal({"socket": "/tmp/" + "é" * 54})
    assert "socket: is 113 bytes long, but a Unix socket path holds at most 107 bytes" in message
    assert "socket: is 108 bytes long" in refusal({"socket": "/tmp/" + "x" * 103})


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("a\x00b", "model: contains a NUL character (at character 1)"),
        ("qwen\n", "model: contains a control character (U+000A at character 4)"),
        ("qwen\x7f", "model: contains a control character (U+007F at character 4)"),
        ("qwen\x85", "model: contains a control character (U+0085 at character 4)"),
        ("qwen\ud800", "model: is not valid Unicode (lone surrogate U+D800 at character 4)"),
    ],
)
def test_a_model_id_with_control_characters_is_refused(model: str, expected: str) -> None:
    assert expected in refusal({"socket": "s", "model": model})


def test_a_model_id_may_hold_any_printable_text() -> None:
    # It is percent-encoded in ?model= and escaped in JSON, so "/", "&", spaces and non-ASCII are safe.
    model = "org/Qwen3 8B?x=1&y=é"
    assert parse_config({"socket": "s", "model": model}).model == model


def test_a_model_id_fits_the_request_target_llama_server_accepts_percent_encoded() -> None:
    # Every GET carries it as ?model=; llama-server refuses a target past 8,192 bytes.
    assert parse_config({"socket": "s", "model": "m" * 2048}).model == "m" * 2048
    message = refusal({"socket": "s", "model": "m" * 2049})
    assert "model: is 2049 bytes percent-encoded in a GET's ?model=, more than the 2048" in message
    # "é" is two bytes of UTF-8, six percent-encoded: 341 fit (2,046 bytes), 342 do not.
    assert parse_config({"socket": "s", "model": "é" * 341}).model == "é" * 341
    assert "model: is 2052 bytes percent-encoded" in refusal({"socket": "s", "model": "é" * 342})


@pytest.mark.parametrize(
    ("path", "at"), [("/tmp/\n.sock", "U+000A at character 5"), ("/tmp/a\x1b.sock", "U+001B at character 6")]
)
def test_a_socket_path_with_a_control_character_is_refused(path: str, at: str) -> None:
    # It would split the log lines and the errors that name it.
    assert f"socket: contains a control character ({at})" in refusal({"socket": path})


def test_a_nul_in_the_tool_prefill_is_refused_but_newlines_are_text() -> None:
    message = refusal(with_section("selftest", tool_prefill='<tool_call>\x00{"name"'))
    assert "selftest.tool_prefill: contains a NUL character (at character 11)" in message
    prefill = '<tool_call>\n{"name": "'
    assert parse_config(with_section("selftest", tool_prefill=prefill)).selftest.tool_prefill == prefill


def test_a_long_bad_value_is_quoted_short() -> None:
    message = refusal({"socket": "s", "model": "\n" + "m" * 100_000})
    assert "model: contains a control character" in message
    assert len(message) < 400


# --- any input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [None, 5, "socket = 's'", ["socket", "s"], Config(socket="s")])
def test_parse_config_refuses_anything_but_a_mapping(data: Any) -> None:
    message = refusal(data)
    assert message.startswith("cfg.toml: the config must be a table of keys, not ")


# What tomllib can produce: tables, arrays, strings, integers of any size, floats with inf and nan,
# booleans and the four date and time kinds.
TOML_SCALARS = (
    st.text()
    | st.integers()
    | st.floats()
    | st.booleans()
    | st.datetimes()
    | st.datetimes(timezones=st.just(dt.UTC))
    | st.dates()
    | st.times()
)
SECTION_KEYS = sorted(
    {"socket", "model", "limits", "retry", "sampling", "expect", "selftest"}
    | {name for model in (Limits, Retry, Sampling, Expect, SelfTest) for name in model.model_fields}
)
KEYS = st.sampled_from(SECTION_KEYS) | st.text(max_size=4)
TOML_VALUES = st.recursive(
    TOML_SCALARS | st.sampled_from([0, 1, -1, 2**31, 2**63, MAX_MS, "/tmp/s", "a\x00b"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, TOML_VALUES, max_size=8))
def test_any_toml_document_loads_or_is_one_config_error(data: dict[str, Any]) -> None:
    # Anything else (a pydantic error, a RecursionError from quoting the value) escapes and fails.
    try:
        assert isinstance(parse_config(data), Config)
    except ConfigError as exc:
        assert str(exc).startswith("config: ")
