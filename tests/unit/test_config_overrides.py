"""`load_config(path, overrides=...)`: a mapping shaped like the TOML laid over the file, tables
merged key by key and other values replaced, and checked exactly as the file is."""

from __future__ import annotations

import copy
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import ConfigError, load_config, parse_config

FILE = """socket = "/run/loopd/infer.sock"
model = "qwen3"

[limits]
poll_ms = 1000
liveness_ms = 2000

[retry]
attempts = 4
delays_ms = [10, 20, 30]
"""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    written = tmp_path / "config.toml"
    written.write_text(FILE, encoding="utf-8")
    return written


def test_an_override_in_a_table_keeps_the_files_other_keys_of_that_table(path: Path) -> None:
    cfg = load_config(path, overrides={"limits": {"poll_ms": 500}})
    assert (cfg.limits.poll_ms, cfg.limits.liveness_ms) == (500, 2000)
    assert cfg.model == "qwen3" and cfg.retry.delays_ms == (10, 20, 30)


def test_a_top_level_value_is_replaced(path: Path) -> None:
    cfg = load_config(path, overrides={"socket": "/tmp/other.sock"})
    assert cfg.socket == "/tmp/other.sock" and cfg.limits.poll_ms == 1000


def test_an_array_is_replaced_whole_not_merged_entry_by_entry(path: Path) -> None:
    cfg = load_config(path, overrides={"retry": {"attempts": 2, "delays_ms": [5]}})
    assert (cfg.retry.attempts, cfg.retry.delays_ms) == (2, (5,))


def test_a_table_the_file_lacks_is_added(path: Path) -> None:
    expect = {"chat_template_sha256": "0" * 64, "n_ctx": 4096, "total_slots": 2}
    cfg = load_config(path, overrides={"expect": expect, "cache": {"predict": True}})
    assert cfg.expect is not None and cfg.expect.total_slots == 2
    assert cfg.cache.predict is True


def test_without_overrides_or_with_none_the_file_loads_as_it_is(path: Path) -> None:
    assert load_config(path, overrides={}) == load_config(path) == load_config(path, None)


def test_the_result_is_the_config_parse_config_makes_of_the_merged_table(path: Path) -> None:
    merged = {
        "socket": "/run/loopd/infer.sock",
        "model": "qwen3",
        "limits": {"poll_ms": 1000, "liveness_ms": 50},
        "retry": {"attempts": 4, "delays_ms": [10, 20, 30]},
        "sampling": {"seed": 7},
    }
    overridden = load_config(path, overrides={"limits": {"liveness_ms": 50}, "sampling": {"seed": 7}})
    assert overridden == parse_config(merged)


def test_a_table_given_as_any_mapping_is_merged(path: Path) -> None:
    cfg = load_config(path, overrides=MappingProxyType({"limits": MappingProxyType({"poll_ms": 700})}))
    assert (cfg.limits.poll_ms, cfg.limits.liveness_ms) == (700, 2000)


def test_neither_the_overrides_nor_a_second_load_of_the_file_is_changed(path: Path) -> None:
    overrides: dict[str, Any] = {"limits": {"poll_ms": 500}, "retry": {"attempts": 2, "delays_ms": [5]}}
    kept = copy.deepcopy(overrides)
    load_config(path, overrides=overrides)
    assert overrides == kept
    assert load_config(path).limits.poll_ms == 1000


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"limits": {"poll_ms": 0}}, "limits.poll_ms: Input should be greater than 0 (got 0)"),
        ({"limits": {"lvieness_ms": 5}}, "limits.lvieness_ms: unknown key"),
        ({"limitz": {"poll_ms": 5}}, "limitz: unknown key"),
        ({"limits": 5}, "limits: must be a table ([limits] with its keys), not a number"),
        ({"retry": {"attempts": 3}}, "retry.delays_ms: has 3 entries but attempts = 3 needs 2"),
        ({"retry": {"delays_ms": {1, 2, 3}}}, "retry.delays_ms: must be an array"),
        ({"socket": "a\x00b"}, "socket: contains a NUL character"),
    ],
)
def test_a_bad_override_is_named_by_its_key_path_as_in_a_file(path: Path, overrides: Any, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides=overrides)
    assert str(caught.value).startswith(f"{path} with overrides: ")
    assert said in str(caught.value)


def test_overrides_that_are_not_a_table_are_refused(path: Path) -> None:
    with pytest.raises(ConfigError, match=r"the overrides must be a table of keys, not list$"):
        load_config(path, overrides=[("limits", {})])  # type: ignore[arg-type]


def test_a_file_that_cannot_be_read_is_named_as_without_overrides(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(missing, overrides={"socket": "/tmp/s"})


LIMIT_VALUES = {
    "poll_ms": st.integers(1, 10**6),
    "liveness_ms": st.integers(1, 10**6),
    "thinking_cap": st.integers(1, 10**6),
    "queue_per_slot": st.integers(0, 1024),
}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries({}, optional=LIMIT_VALUES))
def test_each_overridden_limit_takes_its_value_and_every_other_keeps_the_files(
    path: Path, limits: dict[str, int]
) -> None:
    cfg = load_config(path, overrides={"limits": limits})
    base = load_config(path)
    for name in LIMIT_VALUES:
        assert getattr(cfg.limits, name) == limits.get(name, getattr(base.limits, name))
