"""Caller-supplied JSON, held to one rule before anything is sent, and the rendering of a request
body built from it (`encode_json`).

Every JSON tree a caller hands in (a tool's `parameters`, `response_format`) goes through
`json_tree`, which returns it as plain JSON (mappings as dicts in the caller's own key order,
tuples as lists) or raises a `RequestError` naming the path of the first part that breaks the rule
(`tools[0].parameters.properties has a key that is not a string: 1`):

- Keys are strings. `json.dumps` would turn the key `1` into `"1"` silently, so `{1: ..., "1": ...}`
  would go out with one key twice, and the server would keep whichever it read last.
- Values are JSON: a string, an integer, a finite float, a bool, `None`, a mapping, a list or a
  tuple. Anything else (a set, bytes, a `Decimal`, an object) is refused, not coerced.
- Text is valid Unicode: a lone surrogate cannot be encoded as UTF-8.
- Integers fit in 64 bits: llama-server's JSON reader keeps a number in an int64 or a uint64 and
  turns a longer one into a double, which rounds it (or makes it infinite).
- At most `MAX_JSON_DEPTH` levels of nesting below the root (which also stops a cycle) and
  `MAX_JSON_VALUES` values in all (which also stops a tree that holds one subtree many times,
  cheap to build and exponential to render).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

import orjson

from domain.errors import RequestError, shown

# A JSON Schema a model can follow is a few levels deep; the cap also stops a cycle.
MAX_JSON_DEPTH: Final = 64
# A schema a grammar is built from has tens or hundreds of values; this many is a mistake.
MAX_JSON_VALUES: Final = 100_000
INT64_MIN: Final = -(2**63)
UINT64_MAX: Final = 2**64 - 1


def valid_text(text: str, where: str) -> str:
    """`text`, or `RequestError` if it cannot be encoded as UTF-8 (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{where} holds text that is not valid Unicode ({exc.reason})") from exc
    return text


def json_tree(value: object, root: str) -> Any:
    """`value` as plain JSON, checked against the module's rule; `root` names it in messages."""
    return _Walk(root).value(value, root, 0)


class _Walk:
    __slots__ = ("left", "root")

    def __init__(self, root: str) -> None:
        self.root = root
        self.left = MAX_JSON_VALUES

    def value(self, value: object, where: str, depth: int) -> Any:
        self.left -= 1
        if self.left < 0:
            raise RequestError(f"{self.root} holds more than {MAX_JSON_VALUES} values (at {where})")
        if isinstance(value, str):
            return valid_text(value, where)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if not INT64_MIN <= value <= UINT64_MAX:
                raise RequestError(
                    f"{where} must be an integer from {INT64_MIN} to {UINT64_MAX},"
                    f" not {shown(value)}"
                )
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise RequestError(f"{where} must be a finite number, not {shown(value)}")
            return value
        if depth >= MAX_JSON_DEPTH:
            raise RequestError(
                f"{self.root} is nested more than {MAX_JSON_DEPTH} levels deep (at {where})"
            )
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise RequestError(f"{where} has a key that is not a string: {shown(key)}")
                out[valid_text(key, f"{where} key")] = self.value(item, f"{where}.{key}", depth + 1)
            return out
        if isinstance(value, list | tuple):
            return [self.value(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
        raise RequestError(f"{where} is a {type(value).__name__}, not a JSON value")


def encode_json(body: dict[str, Any], what: str) -> bytes:
    """`body` (its numbers all checked finite) as compact UTF-8 JSON, by orjson (µs before the
    first byte); where orjson refuses, the stdlib's encoder renders it or names the fault."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        pass
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{what} holds text that is not valid Unicode ({exc.reason})") from exc
    except (TypeError, ValueError) as exc:
        raise RequestError(f"{what} cannot be rendered as JSON: {exc}") from exc
    except RecursionError as exc:
        raise RequestError(f"{what} is nested too deeply to render as JSON") from exc
