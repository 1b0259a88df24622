"""The per-request options of a chat (`ChatRequest.max_tokens` is `domain.request`'s), checked
and placed: `sampling`, `stop`, `response_format`, `prefill`.

- Unset, they change nothing: the body is byte for byte what it is without them. Set,
  `max_tokens` and each sampling field take the config's value's place (same key, same
  position); a sampling field the config leaves out goes where it would have been. `stop` and
  then `response_format` come last, and only when given.
- Each is held to the bounds the config's own values are held to (llama-server keeps token
  counts and `top_k` in an int32, `seed` in a uint32 with -1 for random, `temperature` in a C
  float). `stop` is at most `MAX_STOP` non-empty strings (llama-server sets no limit; more than a
  few is a mistake).
- `response_format` is checked only where llama-server would misread it silently: a `type` it
  does not know is an error there, but a missing or non-string `type`, a `json_schema` without a
  `schema` object, or a `schema` that is not an object all quietly become "any JSON" or "no
  constraint". Everything else is sent exactly as given, key order kept: the grammar follows the
  schema's property order.
- With tools, `response_format` wins: the answer is held to the schema and no tool can be called.
  `tool_choice: "required"` with a `response_format` asks for both and is refused.
- `prefill` is sent as the last message, `{"role": "assistant", "content": prefill}`: the very
  bytes of an `AssistantMessage(prefill)` at the end of the messages, which llama-server goes on
  from. It is refused where llama-server would refuse the request (after another assistant
  message: it allows one at the end; with thinking on: it refuses a prefill then) and when it is
  empty (which would prefill nothing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.errors import RequestError, shown
from domain.json_check import MAX_JSON_DEPTH, json_tree, valid_text
from domain.messages import AssistantMessage, Sampling

__all__ = [
    "FLOAT32_MAX",
    "INT32_MAX",
    "MAX_FORMAT_DEPTH",
    "MAX_STOP",
    "RANDOM_SEED",
    "RESPONSE_FORMAT_TYPES",
    "SAMPLING_FIELDS",
    "UINT32_MAX",
    "RequestSettings",
    "checked_prefill",
    "checked_response_format",
    "sampling_fields",
    "stop_strings",
]

# The bounds of llama-server's numbers, which a request's options, its answers (`domain.llama_api`)
# and the config (`app.config`) are all held to: it reads token counts, slot ids, `top_k` and
# `n_ctx` into int32 (a bigger JSON number is silently truncated), `seed` into uint32 (-1 is its
# "random seed", any other negative number would wrap), `temperature` into a C float (past its
# range it arrives as inf).
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
RANDOM_SEED = -1
FLOAT32_MAX = 3.4028234663852886e38
SAMPLING_FIELDS: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p", "seed")
# llama-server takes any number of stop strings and checks each against the tail of the answer
# after every token; past this many, the list is a mistake, not a request.
MAX_STOP = 16
# The `type`s llama-server knows; "text" means no constraint.
RESPONSE_FORMAT_TYPES: tuple[str, ...] = ("json_schema", "json_object", "text")
# How deep a `response_format` may nest: the depth every caller JSON tree is held to.
MAX_FORMAT_DEPTH = MAX_JSON_DEPTH


def _number(value: object, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{where} must be a number, not {type(value).__name__}")
    try:
        # A float, as the config's floats are: `1` and `1.0` render the same.
        number = float(value)
    except OverflowError:  # an int past the float range
        number = math.inf
    if not low <= number <= high:  # also refuses nan
        raise RequestError(
            f"{where} must be a finite number from {low:g} to {high:g}, not {shown(value)}"
        )
    return number


def _integer(value: object, where: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(f"{where} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise RequestError(f"{where} must be from {low} to {high}, not {shown(value)}")
    return value


def _sampling_override(name: str, value: object) -> float | int:
    where = f"sampling.{name}"
    if name == "temperature":
        return _number(value, where, 0.0, FLOAT32_MAX)
    if name == "top_k":
        return _integer(value, where, 0, INT32_MAX)
    if name == "seed":
        return _integer(value, where, RANDOM_SEED, UINT32_MAX)
    return _number(value, where, 0.0, 1.0)  # top_p, min_p


@dataclass(frozen=True, slots=True)
class RequestSettings:
    """What every request carries besides its inputs. `None` leaves a sampling field out."""

    model: str
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    # Sent as `thinking_budget_tokens` with every thinking request: the server ends the thinking
    # block at exactly this many tokens. None sends nothing (the client's reasoning_end call alone).
    thinking_budget: int | None = None
    # The sampling fields set, in their fixed order: what a request without `sampling` sends.
    sampled: tuple[tuple[str, float | int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sampled = tuple(
            (name, value) for name in SAMPLING_FIELDS if (value := getattr(self, name)) is not None
        )
        object.__setattr__(self, "sampled", sampled)


def sampling_fields(override: object, settings: RequestSettings) -> dict[str, Any]:
    """The sampling fields in their fixed order: the request's value, else the config's."""
    if override is None:
        return dict(settings.sampled)
    if not isinstance(override, Sampling):
        raise RequestError(f"sampling must be a Sampling, not {type(override).__name__}")
    out: dict[str, Any] = {}
    for name in SAMPLING_FIELDS:
        mine = getattr(override, name)
        value = getattr(settings, name) if mine is None else _sampling_override(name, mine)
        if value is not None:
            out[name] = value
    return out


def stop_strings(stop: object) -> list[str]:
    if not isinstance(stop, tuple | list):
        raise RequestError(f"stop must be a tuple or list of strings, not {type(stop).__name__}")
    if len(stop) > MAX_STOP:
        raise RequestError(f"stop has {len(stop)} strings, more than {MAX_STOP}")
    out = []
    for index, text in enumerate(stop):
        where = f"stop[{index}]"
        if not isinstance(text, str) or not text:
            raise RequestError(f"{where} must be a non-empty string, not {shown(text)}")
        out.append(valid_text(text, where))
    return out


def _schema_object(container: Mapping[str, Any], where: str, *, required: bool) -> None:
    if "schema" not in container and not required:
        return
    if not isinstance(container.get("schema"), Mapping):
        found = type(container["schema"]).__name__ if "schema" in container else "nothing"
        raise RequestError(f"{where}.schema must be a JSON Schema object, not {found}")


def checked_response_format(value: object) -> dict[str, Any] | None:
    """The caller's `response_format`, checked where llama-server would misread it silently."""
    if value is None:
        return None
    where = "response_format"
    if not isinstance(value, Mapping):
        raise RequestError(f"{where} must be a mapping, not {type(value).__name__}")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in RESPONSE_FORMAT_TYPES:
        raise RequestError(
            f"{where}.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, not {shown(kind)}"
        )
    if kind == "json_schema":
        wrapper = value.get("json_schema")
        if not isinstance(wrapper, Mapping):
            raise RequestError(
                f"{where}.json_schema must be a mapping, not {type(wrapper).__name__}"
            )
        if "name" in wrapper and not isinstance(wrapper["name"], str):
            raise RequestError(
                f"{where}.json_schema.name must be a string, not {type(wrapper['name']).__name__}"
            )
        _schema_object(wrapper, f"{where}.json_schema", required=True)
    elif kind == "json_object":
        _schema_object(value, where, required=False)
    tree: dict[str, Any] = json_tree(value, where)
    return tree


def checked_prefill(value: object, *, thinking: bool, last: object) -> str | None:
    """The caller's `prefill`, sent after the messages (the last of them `last`) as the answer's
    opening; None when there is none."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise RequestError(f"prefill must be a string, not {type(value).__name__}")
    if not value:
        raise RequestError("prefill is empty: give the answer's opening, or None for no prefill")
    valid_text(value, "prefill")
    if thinking:
        raise RequestError(
            "prefill cannot be combined with thinking:"
            " llama-server refuses an assistant prefill then"
        )
    if isinstance(last, AssistantMessage):
        raise RequestError(
            "prefill cannot follow an assistant message:"
            " llama-server refuses two assistant messages at the end"
        )
    return value
