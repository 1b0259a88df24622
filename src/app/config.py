"""`config.toml` into one frozen, typed `Config`.

Unknown keys anywhere are errors, every limit has the brief's default in the unit its name says,
and every bad input becomes one `ConfigError` whose message names the file, the key path and what
is wrong. The domain never sees this object: the container hands it plain values.

Invariants, so that a config that loads is one that can work:
- Every value has an upper bound the layer that uses it accepts: waits fit socket timeouts and
  thread waits, token counts fit llama-server's int32 fields, byte caps stay caps.
- Floats are finite: `inf`/`nan` load from TOML but fail every request later.
- Strings carry no NUL (C strings stop there: the socket path would be cut and the request go to
  another socket), and `socket` fits an AF_UNIX address.
- The file is read by `app.config_file` (a regular file of at most 1 MiB, its TOML parsed
  within bounded time).
- A message quotes each bad value cut short (`domain.errors.shown`) and names at most
  `MAX_PROBLEMS` problems, so no input makes it large.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from app import config_checks as checks
from app.config_file import ConfigError, read_toml
from domain.errors import shown
from domain.request_options import INT32_MAX, RANDOM_SEED, UINT32_MAX

__all__ = ["Config", "ConfigError", "load_config", "parse_config"]

# Longest wait any `*_ms` key may ask for: 7 days. Far past any wait the brief gives (10 min),
# and far inside what the waits accept: `threading` refuses a timeout past `threading.TIMEOUT_MAX`
# (292 years on Linux, 49.7 days where it counts in 32-bit milliseconds), a socket wait reaches
# poll() as int milliseconds (24.8 days at most), and milliseconds this size are exact as float
# seconds. Near 2**63 the first call raised OverflowError instead.
MAX_MS = 7 * 24 * 60 * 60 * 1000
# Each byte cap is memory one request may hold; past 1 GiB a cap no longer protects anything.
MAX_CAP_BYTES = 1 << 30
# Below these, what llama-server sends in every exchange could not fit: its response head (172
# bytes), an event line (626 bytes at most in the recorded streams, a tool call's delta more), a
# `/props` answer (the chat template, tens of KiB for some models), a short answer's text.
MIN_HEADER_BYTES, MIN_SSE_LINE_BYTES, MIN_BODY_BYTES, MIN_ANSWER_BYTES = 1024, 4096, 64 * 1024, 4096
# Each tool call the model makes is one object kept until the answer is whole, even when its
# deltas carry nothing; a model that makes more than this in one answer is broken or hostile.
MAX_TOOL_CALLS = 65536
# Each waiter is a caller thread blocked on one slot that serves one request at a time; a longer
# queue is a flood that the gate should answer with Busy.
MAX_QUEUE_PER_SLOT = 1024
# Every attempt after the first needs its own entry in `delays_ms`; more than this is a typo.
MAX_ATTEMPTS = 100
# The waits between attempts when `retry` says nothing: the brief's schedule.
DEFAULT_DELAYS_MS = (2000, 8000, 30_000)
# A session's checkpoint is its KV cache on the server's disk: 22 KiB a token for the small test
# model, about 0.5 MiB for a 7B model at f16 (without GQA), so 4 GiB keeps a few long sessions;
# past 1 TiB the cap no longer guards a disk.
SESSION_DISK_MB, SESSION_DISK_MB_MAX = 4096, 1 << 20
# The most problems one ConfigError names (then how many more there are).
MAX_PROBLEMS = 10


Ms = Annotated[StrictInt, Field(gt=0, le=MAX_MS)]
DelayMs = Annotated[StrictInt, Field(ge=0, le=MAX_MS)]
Tokens = Annotated[StrictInt, Field(gt=0, le=INT32_MAX)]
CapBytes = Annotated[StrictInt, Field(gt=0, le=MAX_CAP_BYTES)]

HeaderBytes = Annotated[StrictInt, Field(ge=MIN_HEADER_BYTES, le=MAX_CAP_BYTES)]
SseLineBytes = Annotated[StrictInt, Field(ge=MIN_SSE_LINE_BYTES, le=MAX_CAP_BYTES)]
BodyBytes = Annotated[StrictInt, Field(ge=MIN_BODY_BYTES, le=MAX_CAP_BYTES)]
AnswerBytes = Annotated[StrictInt, Field(ge=MIN_ANSWER_BYTES, le=MAX_CAP_BYTES)]
Text = Annotated[StrictStr, AfterValidator(checks.no_nul), AfterValidator(checks.utf8)]


def _array(value: object) -> object:
    """A list or tuple, as TOML's arrays load: a set (or any other iterable) is refused, as its
    order, the waits' order, is not the caller's."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"must be an array, not {_toml_type(value)}")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Limits(_Section):
    poll_ms: Ms = 5000
    busy_wait_ms: Ms = 600_000
    load_wait_ms: Ms = 180_000
    idle_grace_ms: Ms = 30_000
    liveness_ms: Ms = 30_000
    thinking_cap: Tokens = 4096
    thinking_overrun: Tokens = 256
    max_tokens: Tokens = 8192
    queue_per_slot: Annotated[StrictInt, Field(ge=0, le=MAX_QUEUE_PER_SLOT)] = 8
    header_bytes: HeaderBytes = 16 * 1024
    sse_line_bytes: SseLineBytes = 1024 * 1024
    body_bytes: BodyBytes = 4 * 1024 * 1024
    error_body_bytes: CapBytes = 4096  # what an error keeps of its body: any size works
    answer_bytes: AnswerBytes = 16 * 1024 * 1024
    tool_calls: Annotated[StrictInt, Field(gt=0, le=MAX_TOOL_CALLS)] = 128
    cache_loss_tokens: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 64


class Retry(_Section):
    attempts: Annotated[StrictInt, Field(gt=0, le=MAX_ATTEMPTS)] = 4
    delays_ms: Annotated[
        tuple[DelayMs, ...], BeforeValidator(_array), Field(validate_default=True)
    ] = DEFAULT_DELAYS_MS
    jitter: Annotated[StrictFloat, Field(ge=0.0, lt=1.0)] = 0.25
    total_ms: Ms = 300_000

    @field_validator("delays_ms")
    @classmethod
    def _one_delay_between_attempts(
        cls, delays: tuple[int, ...], info: ValidationInfo
    ) -> tuple[int, ...]:
        attempts = info.data.get("attempts")
        if attempts is not None and len(delays) != attempts - 1:
            raise ValueError(
                f"has {_entries(len(delays))} but attempts = {attempts}"
                f" needs {_entries(attempts - 1)} "
                f"(one wait between two attempts), e.g. delays_ms = {_delays_for(attempts)}"
            )
        return delays


def _entries(count: int) -> str:
    return f"{count} entry" if count == 1 else f"{count} entries"


def _delays_for(attempts: int) -> str:
    """A `delays_ms` that fits `attempts`: the default waits cut short, or with the last
    repeated."""
    needed = attempts - 1
    delays = list(DEFAULT_DELAYS_MS[:needed])
    delays += [DEFAULT_DELAYS_MS[-1]] * (needed - len(delays))
    return "[" + ", ".join(str(delay) for delay in delays) + "]"


class Sampling(_Section):
    temperature: Annotated[StrictFloat, Field(ge=0.0), AfterValidator(checks.fits_c_float)] = 0.6
    top_p: Annotated[StrictFloat, Field(ge=0.0, le=1.0)] = 0.95
    top_k: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 20
    min_p: Annotated[StrictFloat, Field(ge=0.0, le=1.0)] = 0.0
    seed: Annotated[StrictInt, Field(ge=RANDOM_SEED, le=UINT32_MAX)] = RANDOM_SEED


class Expect(_Section):
    chat_template_sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
    n_ctx: Tokens
    total_slots: Annotated[StrictInt, Field(gt=0, le=INT32_MAX)]


class Cache(_Section):
    # Render and tokenize each request before sending it, to emit `CachePrediction`: two small
    # requests and a `/slots` read per turn (see the README for their cost). A slot with a
    # checkpoint is predicted either way, to restore it when the server emptied it.
    predict: StrictBool = False
    # The disk the sessions' checkpoints may take in the server's --slot-save-path folder, in MB
    # (what it bounds exactly: `domain.checkpoint_pool`); 0 keeps none (sessions still placed).
    session_disk_mb: Annotated[StrictInt, Field(ge=0, le=SESSION_DISK_MB_MAX)] = SESSION_DISK_MB


class SelfTest(_Section):
    tool_prefill: Text = ""


class Proxy(_Section):
    # The accept limit of the inferproxy in front of the server (`--burst`, `--rate`; these are
    # its defaults): every connect of the container's clients takes its turn under it, a little
    # inside it (`domain.connect_budget`), so that the proxy never refuses one of ours.
    burst: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 10
    rate: Annotated[StrictFloat | StrictInt, Field(gt=0, le=1_000_000)] = 2.0
    # Its `--max-conns`: the container's connections open at once stay one below it (its spare
    # holds one), a connect past that waiting locally for a place (`domain.conn_places`).
    max_conns: Annotated[StrictInt, Field(ge=1, le=1024)] = 8


class Config(_Section):
    socket: Annotated[
        StrictStr,
        Field(min_length=1),
        AfterValidator(checks.no_nul),
        AfterValidator(checks.no_control),
        AfterValidator(checks.socket_path),
    ]
    model: Annotated[
        Text,
        Field(min_length=1),
        AfterValidator(checks.no_control),
        AfterValidator(checks.fits_a_target),
    ] = "default"
    limits: Limits = Limits()
    retry: Retry = Retry()
    sampling: Sampling = Sampling()
    expect: Expect | None = None
    cache: Cache = Cache()
    selftest: SelfTest = SelfTest()
    proxy: Proxy = Proxy()


def _describe(error: Any) -> str:
    path = ".".join(str(part) for part in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{path}: unknown key"
    if kind == "missing":
        return f"{path}: required key is missing"
    if kind in (
        "model_type",
        "dict_type",
    ):  # pydantic would name its own class ("instance of Limits")
        kind = _toml_type(error.get("input"))
        return f"{path}: must be a table ([{path}] with its keys), not {kind}"
    message = str(error["msg"]).removeprefix("Value error, ")
    if "input" in error:
        return f"{path}: {message} (got {shown(error['input'])})"
    return f"{path}: {message}"


def _toml_type(value: object) -> str:
    """What a TOML value is, in TOML's words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array (a [[section]] is an array of tables)"
    return f"a {type(value).__name__}"


def parse_config(data: Mapping[str, Any], source: str = "config") -> Config:
    """Validate an already-parsed mapping; raises `ConfigError` naming every bad key."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the config must be a table of keys, not {type(data).__name__}"
        )
    try:
        return Config.model_validate(dict(data))
    except ValidationError as exc:
        errors = exc.errors()
        lines = "; ".join(_describe(e) for e in errors[:MAX_PROBLEMS])
        more = f"; and {len(errors) - MAX_PROBLEMS} more" if len(errors) > MAX_PROBLEMS else ""
        raise ConfigError(f"{source}: {lines}{more}") from exc


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Config:
    """Read a TOML file into a `Config`; raises `ConfigError` with a message naming the problem.

    `overrides`, a mapping shaped like the TOML, is laid over the file before anything is
    checked: a table in both is merged key by key, at any depth; any other value (an array
    among them) replaces the file's. The result is checked as a file is, each error naming its
    key path; the message then names the file "with overrides", as the value may come from
    either."""
    path = Path(path)
    data = read_toml(path)
    if overrides is None:
        return parse_config(data, str(path))
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            f"{path}: the overrides must be a table of keys, not {type(overrides).__name__}"
        )
    return parse_config(_laid_over(data, overrides), f"{path} with overrides")


def _laid_over(below: Mapping[Any, Any], above: Mapping[Any, Any]) -> dict[Any, Any]:
    """`above` laid over `below`, neither changed: tables in both merged, anything else replaced."""
    out = dict(below)
    for key, value in above.items():
        if isinstance(value, Mapping):
            under = out.get(key)
            out[key] = _laid_over(under if isinstance(under, Mapping) else {}, value)
        else:
            out[key] = value
    return out
