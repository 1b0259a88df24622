"""The hash refuses text and says what it got instead."""

from __future__ import annotations

import pytest

from domain.hashing import Sha256, sha256


@pytest.mark.parametrize(("data", "kind"), [("abc", "str"), (123, "int"), (None, "NoneType")])
def test_a_value_that_is_not_bytes_is_refused_by_its_type_name(data: object, kind: str) -> None:
    with pytest.raises(TypeError) as caught:
        sha256(data)  # type: ignore[arg-type]
    assert str(caught.value) == f"sha256 takes bytes, not {kind}; encode text first"
    with pytest.raises(TypeError, match=f"not {kind};"):
        Sha256().update(data)  # type: ignore[arg-type]
