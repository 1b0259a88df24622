"""The checks a config's single values go through (`app.config`), each a pydantic validator that
returns the value or raises `ValueError` saying what is wrong with it.

- Strings carry no NUL (C strings stop there: the socket path would be cut and the request go to
  another socket) and no control character where one would break a line or a request.
- `socket` fits an AF_UNIX address; `model` fits a GET's `?model=` as llama-server reads it.
- Floats fit a C float; arrays are lists or tuples, whose order is the caller's.
"""

from __future__ import annotations

import os
import unicodedata

from domain.llama_api import with_model
from domain.request_options import FLOAT32_MAX

__all__ = [
    "MODEL_QUERY_BYTES",
    "SERVER_TARGET_BYTES",
    "SOCKET_PATH_BYTES",
    "fits_a_target",
    "fits_c_float",
    "no_control",
    "no_nul",
    "socket_path",
    "utf8",
]

# `sun_path` is 108 bytes on Linux, one of them the terminating NUL.
SOCKET_PATH_BYTES = 107
# llama-server refuses a request target longer than this (cpp-httplib's request URI limit); the
# model, percent-encoded in every GET's `?model=`, gets a quarter of it.
SERVER_TARGET_BYTES = 8192
MODEL_QUERY_BYTES = SERVER_TARGET_BYTES // 4


def char_at(text: str, index: int) -> str:
    return f"U+{ord(text[index]):04X} at character {index}"


def no_nul(text: str) -> str:
    index = text.find("\x00")
    if index >= 0:
        raise ValueError(
            f"contains a NUL character (at character {index}); the value would be cut there"
        )
    return text


def utf8(text: str) -> str:
    # TOML cannot hold a lone surrogate, but a mapping handed to `parse_config` can, and the JSON
    # body that carries the value would then fail to encode on every request.
    for index, char in enumerate(text):
        if unicodedata.category(char) == "Cs":
            raise ValueError(f"is not valid Unicode (lone surrogate {char_at(text, index)})")
    return text


def socket_path(path: str) -> str:
    try:
        encoded = os.fsencode(path)
    except UnicodeEncodeError as exc:
        raise ValueError(f"cannot be encoded as a file name ({exc.reason})") from exc
    if len(encoded) > SOCKET_PATH_BYTES:
        raise ValueError(
            f"is {len(encoded)} bytes long,"
            f" but a Unix socket path holds at most {SOCKET_PATH_BYTES} bytes"
        )
    return path


def fits_c_float(value: float) -> float:
    if value > FLOAT32_MAX:
        raise ValueError(
            f"is past {FLOAT32_MAX:.7g}, the largest value of the C float llama-server keeps it in"
        )
    return value


def no_control(text: str) -> str:
    # The model id is percent-encoded in `?model=` and escaped in JSON, so it would arrive intact,
    # but no model is named with control characters: one here is a typo that routes nowhere. A
    # socket path with one would split the log lines and errors that name it.
    for index, char in enumerate(text):
        if unicodedata.category(char) == "Cc":
            raise ValueError(f"contains a control character ({char_at(text, index)})")
    return text


def fits_a_target(model: str) -> str:
    size = len(with_model("", model)) - len("?model=")
    if size > MODEL_QUERY_BYTES:
        raise ValueError(
            f"is {size} bytes percent-encoded in a GET's ?model=,"
            f" more than the {MODEL_QUERY_BYTES} a request line leaves it"
            f" (llama-server refuses a target past {SERVER_TARGET_BYTES} bytes)"
        )
    return model
