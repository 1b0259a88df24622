"""`config.toml` into one frozen, typed `Config`.

Unknown keys anywhere are errors, every limit has the brief's default in the unit its name says,
and every bad input becomes one `ConfigError` whose message names the key path and what is
wrong. The domain never sees this object: the container hands it plain values.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

PositiveMs = Annotated[StrictInt, Field(gt=0)]
PositiveInt = Annotated[StrictInt, Field(gt=0)]


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and every bad key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Section):
    poll_ms: PositiveMs = 5000
    busy_wait_ms: PositiveMs = 600_000
    load_wait_ms: PositiveMs = 180_000
    idle_grace_ms: PositiveMs = 30_000
    liveness_ms: PositiveMs = 30_000
    thinking_cap: PositiveInt = 4096
    thinking_overrun: PositiveInt = 256
    max_tokens: PositiveInt = 8192
    queue_per_slot: Annotated[StrictInt, Field(ge=0)] = 8
    header_bytes: PositiveInt = 16 * 1024
    sse_line_bytes: PositiveInt = 1024 * 1024
    body_bytes: PositiveInt = 4 * 1024 * 1024
    error_body_bytes: PositiveInt = 4096
    answer_bytes: PositiveInt = 16 * 1024 * 1024
    cache_loss_tokens: Annotated[StrictInt, Field(ge=0)] = 64


class Retry(_Section):
    attempts: PositiveInt = 4
    delays_ms: Annotated[tuple[Annotated[StrictInt, Field(ge=0)], ...], Field(validate_default=True)] = (
        2000,
        8000,
        30_000,
    )
    jitter: Annotated[StrictFloat, Field(ge=0.0, lt=1.0)] = 0.25
    total_ms: PositiveMs = 300_000

    @field_validator("delays_ms")
    @classmethod
    def _one_delay_between_attempts(cls, delays: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        attempts = info.data.get("attempts")
        if attempts is not None and len(delays) != attempts - 1:
            raise ValueError(
                f"has {len(delays)} entries but attempts = {attempts} needs {attempts - 1} "
                "(one wait between two attempts)"
            )
        return delays


class Sampling(_Section):
    temperature: Annotated[StrictFloat, Field(ge=0.0)] = 0.6
    top_p: Annotated[StrictFloat, Field(ge=0.0, le=1.0)] = 0.95
    top_k: Annotated[StrictInt, Field(ge=0)] = 20
    min_p: Annotated[StrictFloat, Field(ge=0.0, le=1.0)] = 0.0
    seed: StrictInt = -1


class Expect(_Section):
    chat_template_sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
    n_ctx: PositiveInt
    total_slots: PositiveInt


class SelfTest(_Section):
    tool_prefill: StrictStr = ""


class Config(_Section):
    socket: Annotated[StrictStr, Field(min_length=1)]
    model: Annotated[StrictStr, Field(min_length=1)] = "default"
    limits: Limits = Limits()
    retry: Retry = Retry()
    sampling: Sampling = Sampling()
    expect: Expect | None = None
    selftest: SelfTest = SelfTest()


def _describe(error: Any) -> str:
    path = ".".join(str(part) for part in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{path}: unknown key"
    if kind == "missing":
        return f"{path}: required key is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    if "input" in error and kind not in ("model_type", "dict_type"):
        return f"{path}: {message} (got {error['input']!r})"
    return f"{path}: {message}"


def parse_config(data: dict[str, Any], source: str = "config") -> Config:
    """Validate an already-parsed mapping; raises `ConfigError` naming every bad key."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = "; ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"{source}: {lines}") from exc


def load_config(path: str | Path) -> Config:
    """Read a TOML file into a `Config`; raises `ConfigError` with a message naming the problem."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: config file not found") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{path}: is a directory, not a config file") from exc
    except PermissionError as exc:
        raise ConfigError(f"{path}: config file is not readable (permission denied)") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: not UTF-8 ({exc.reason})") from exc
    return parse_config(data, str(path))
