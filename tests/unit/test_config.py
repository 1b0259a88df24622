"""`load_config`: the brief's defaults, and one clear error naming the key for every bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.config import Config, ConfigError, load_config, parse_config
from app.container import Container

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_config_loads_with_the_briefs_defaults() -> None:
    cfg = load_config(EXAMPLE)
    assert isinstance(cfg, Config)
    assert cfg.socket == "/run/loopd/infer.sock"
    limits = cfg.limits
    # Section 4 of the brief, in the units the names say.
    assert (limits.poll_ms, limits.busy_wait_ms, limits.load_wait_ms) == (5_000, 600_000, 180_000)
    assert (limits.idle_grace_ms, limits.liveness_ms) == (30_000, 30_000)
    assert (limits.thinking_cap, limits.thinking_overrun, limits.max_tokens) == (4096, 256, 8192)
    assert limits.queue_per_slot == 8
    assert (limits.header_bytes, limits.sse_line_bytes, limits.body_bytes) == (16384, 1048576, 4194304)
    assert (limits.error_body_bytes, limits.cache_loss_tokens) == (4096, 64)
    assert cfg.retry.attempts == 4
    assert cfg.retry.delays_ms == (2000, 8000, 30000)
    assert cfg.retry.jitter == 0.25
    assert cfg.retry.total_ms == 300_000
    assert cfg.expect is None
    assert cfg.selftest.tool_prefill == ""


def test_a_minimal_file_gets_every_default(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, 'socket = "/tmp/infer.sock"\n'))
    assert cfg.model == "default"
    assert cfg.limits.liveness_ms == 30_000
    assert cfg.retry.delays_ms == (2000, 8000, 30000)
    assert cfg.sampling.temperature == 0.6


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, 'socket = "/tmp/infer.sock"\n'))
    with pytest.raises(Exception, match="frozen"):
        cfg.limits.poll_ms = 1  # type: ignore[misc]


def test_expect_section_loads_when_present(tmp_path: Path) -> None:
    text = 'socket = "s"\n[expect]\nchat_template_sha256 = "' + "ab" * 32 + '"\nn_ctx = 4096\ntotal_slots = 2\n'
    cfg = load_config(write(tmp_path, text))
    assert cfg.expect is not None
    assert (cfg.expect.n_ctx, cfg.expect.total_slots) == (4096, 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('socket = "s"\n[limits]\nlvieness_ms = 5\n', "limits.lvieness_ms: unknown key"),
        ('socket = "s"\nsockett = "x"\n', "sockett: unknown key"),
        ('socket = "s"\n[limitz]\npoll_ms = 5\n', "limitz: unknown key"),
        ('socket = "s"\n[retry]\nbackoff = 1\n', "retry.backoff: unknown key"),
        (
            'socket = "s"\n[expect]\nn_ctx = 1\ntotal_slots = 1\nchat_template_sha256 = "'
            + "0" * 64
            + '"\nextra = 1\n',
            "expect.extra: unknown key",
        ),
        ('socket = "s"\n[limits]\npoll_ms = "5000"\n', "limits.poll_ms: Input should be a valid integer"),
        ('socket = "s"\n[limits]\npoll_ms = 50.5\n', "limits.poll_ms: Input should be a valid integer"),
        ('socket = "s"\n[limits]\nliveness_ms = 0\n', "limits.liveness_ms: Input should be greater than 0"),
        ('socket = "s"\n[limits]\nbusy_wait_ms = -1\n', "limits.busy_wait_ms: Input should be greater than 0"),
        ('socket = "s"\n[limits]\nthinking_cap = 0\n', "limits.thinking_cap: Input should be greater than 0"),
        ('socket = "s"\n[retry]\nattempts = 3\n', "retry.delays_ms: has 3 entries but attempts = 3 needs 2"),
        ('socket = "s"\n[retry]\ndelays_ms = [1, 2]\n', "retry.delays_ms: has 2 entries but attempts = 4 needs 3"),
        ('socket = "s"\n[retry]\ndelays_ms = [1, -2, 3]\n', "retry.delays_ms.1: Input should be greater than"),
        ('socket = "s"\n[retry]\njitter = 1.0\n', "retry.jitter: Input should be less than 1"),
        ('socket = "s"\n[retry]\njitter = -0.1\n', "retry.jitter: Input should be greater than or equal to 0"),
        ('socket = "s"\n[retry]\nattempts = 0\ndelays_ms = []\n', "retry.attempts: Input should be greater than 0"),
        ('model = "m"\n', "socket: required key is missing"),
        ('socket = ""\n', "socket: String should have at least 1 character"),
        ('socket = "s"\n[expect]\nn_ctx = 4096\n', "expect.chat_template_sha256: required key is missing"),
        (
            'socket = "s"\n[expect]\nchat_template_sha256 = "xyz"\nn_ctx = 1\ntotal_slots = 1\n',
            "expect.chat_template_sha256: String should match pattern",
        ),
        ('socket = "s"\n[sampling]\ntop_p = 2.0\n', "sampling.top_p: Input should be less than or equal to 1"),
        ('socket = "s"\nlimits = 5\n', "limits: must be a table ([limits] with its keys), not a number"),
        ('socket = "s"\n[[limits]]\npoll_ms = 1\n', "limits: must be a table ([limits] with its keys), not an array"),
        ('socket = "s"\nretry = "x"\n', "retry: must be a table ([retry] with its keys), not a string"),
        ('socket = "s"\nexpect = true\n', "expect: must be a table ([expect] with its keys), not a boolean"),
    ],
)
def test_bad_config_names_the_key_and_the_problem(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert expected in message
    assert str(path) in message


def test_every_bad_key_is_named_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, 'socket = "s"\n[limits]\npoll_ms = 0\nlvieness_ms = 1\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "limits.poll_ms" in str(info.value)
    assert "limits.lvieness_ms: unknown key" in str(info.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml: config file not found"):
        load_config(path)


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_unreadable_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root reads any file whatever its mode, so the refusal is played by the file system call.
    path = write(tmp_path, 'socket = "s"\n')

    def refuse(name: object, *args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied", str(name))

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(ConfigError, match="not readable"):
        load_config(path)


def test_unreadable_file_is_named_even_as_root(tmp_path: Path) -> None:
    # A path through a regular file cannot be opened by anyone, root included.
    blocker = write(tmp_path, 'socket = "s"\n')
    with pytest.raises(ConfigError, match=r"cannot read config file|not found"):
        load_config(blocker / "config.toml")


def test_invalid_toml_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'socket = "s"\n[limits]\npoll_ms = = 5\n')
    with pytest.raises(ConfigError, match=r"invalid TOML: .*line 3"):
        load_config(path)


def test_non_utf8_file_is_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b'socket = "\xff\xfe"\n')
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(path)


def test_delays_given_as_a_set_are_refused_as_their_order_would_be_lost() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"socket": "/tmp/s", "retry": {"delays_ms": {30000, 2000, 8000}}})
    assert str(caught.value).startswith("config: retry.delays_ms: must be an array, not a set (got {")


def test_an_integer_with_no_repr_is_named_by_its_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"socket": "/tmp/s", "limits": {"poll_ms": 10**5000}})
    assert str(caught.value) == (
        "config: limits.poll_ms: Input should be less than or equal to 604800000 (got <int with no repr>)"
    )


def test_proxy_max_conns_is_the_proxys_default_and_bounded() -> None:
    assert parse_config({"socket": "/run/x.sock"}).proxy.max_conns == 8
    assert parse_config({"socket": "/run/x.sock", "proxy": {"max_conns": 2}}).proxy.max_conns == 2
    for bad in (0, 1025, 2.5, True):
        with pytest.raises(ConfigError, match=r"proxy\.max_conns"):
            parse_config({"socket": "/run/x.sock", "proxy": {"max_conns": bad}})


def test_the_container_keeps_one_connection_below_the_proxys_max_conns() -> None:
    container = Container(config=parse_config({"socket": "/run/x.sock", "proxy": {"max_conns": 4}}))
    places = container.places()
    held = [places.take_now() for _ in range(4)]  # kept: a place dropped is given back
    assert [place is not None for place in held] == [True, True, True, False]
