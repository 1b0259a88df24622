"""SHA-256 against published vectors (FIPS 180-2) and digests taken with coreutils' sha256sum."""

from __future__ import annotations

import pytest

from domain.hashing import Sha256, sha256

# Literal digests: the first three are the FIPS 180-2 examples; the a*N ones were taken with
# `printf 'a%.0s' $(seq 1 N) | sha256sum`, not with the code under test.
VECTORS: list[tuple[bytes, str]] = [
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"a" * 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"),
    (b"a" * 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"),
    (b"a" * 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"),
    (b"a" * 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"),
    (b"a" * 65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"),
]
MILLION_A = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"


@pytest.mark.parametrize(("message", "hexdigest"), VECTORS, ids=lambda v: f"{len(v)}" if isinstance(v, bytes) else "")
def test_one_shot_digest_matches_the_published_vector(message: bytes, hexdigest: str) -> None:
    assert sha256(message) == bytes.fromhex(hexdigest)
    assert len(sha256(message)) == 32


@pytest.mark.parametrize(("message", "hexdigest"), VECTORS, ids=lambda v: f"{len(v)}" if isinstance(v, bytes) else "")
def test_message_fed_in_two_pieces_at_every_split_point_gives_the_same_digest(message: bytes, hexdigest: str) -> None:
    for split in range(len(message) + 1):
        h = Sha256()
        h.update(message[:split])
        h.update(message[split:])
        assert h.hexdigest() == hexdigest, f"split at {split}"
        assert h.digest() == bytes.fromhex(hexdigest)


def test_million_a_message_matches_fips_vector_whole_and_in_pieces() -> None:
    message = b"a" * 1_000_000
    assert sha256(message).hex() == MILLION_A
    h = Sha256()
    for _ in range(1000):
        h.update(b"a" * 1000)
    assert h.hexdigest() == MILLION_A
    h2 = Sha256(message[:333_333]).update(message[333_333:])
    assert h2.hexdigest() == MILLION_A


def test_digest_does_not_end_the_hash() -> None:
    h = Sha256(b"ab")
    h.digest()
    h.update(b"c")
    assert h.hexdigest() == VECTORS[1][1]


def test_accepts_bytearray_and_memoryview() -> None:
    assert sha256(bytearray(b"abc")).hex() == VECTORS[1][1]
    assert sha256(memoryview(b"abc")).hex() == VECTORS[1][1]


def test_text_is_refused_so_no_implicit_encoding_decides_the_hash() -> None:
    with pytest.raises(TypeError, match="encode text first"):
        sha256("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Sha256().update("abc")  # type: ignore[arg-type]


# -- what is not bytes is refused by the name of its type ------------------------------------------


@pytest.mark.parametrize(("data", "kind"), [("abc", "str"), (123, "int"), (None, "NoneType")])
def test_a_value_that_is_not_bytes_is_refused_by_its_type_name(data: object, kind: str) -> None:
    with pytest.raises(TypeError) as caught:
        sha256(data)  # type: ignore[arg-type]
    assert str(caught.value) == f"sha256 takes bytes, not {kind}; encode text first"
    with pytest.raises(TypeError, match=f"not {kind};"):
        Sha256().update(data)  # type: ignore[arg-type]
