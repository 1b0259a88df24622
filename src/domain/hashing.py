"""SHA-256 over the standard library's vetted implementation (hashlib).

`sha256(data)` for one message; `Sha256` to feed a message in pieces. Only bytes are accepted:
text must be encoded by the caller, so a hash never depends on an implicit encoding.
"""

from __future__ import annotations

import hashlib

DIGEST_SIZE = 32


def _require_bytes(data: object) -> bytes | bytearray | memoryview:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"sha256 takes bytes, not {type(data).__name__}; encode text first")
    return data


def sha256(data: bytes | bytearray | memoryview) -> bytes:
    """The 32-byte SHA-256 digest of `data`."""
    return hashlib.sha256(_require_bytes(data)).digest()


class Sha256:
    """Incremental SHA-256: `update` any number of times, then `digest` or `hexdigest`.

    `digest` does not end the hash: more `update` calls continue the same message.
    """

    __slots__ = ("_h",)

    def __init__(self, data: bytes | bytearray | memoryview = b"") -> None:
        self._h = hashlib.sha256(_require_bytes(data))

    def update(self, data: bytes | bytearray | memoryview) -> Sha256:
        self._h.update(_require_bytes(data))
        return self

    def digest(self) -> bytes:
        return self._h.digest()

    def hexdigest(self) -> str:
        return self._h.hexdigest()
