"""stream_error takes a code as the status exactly when it is an HTTP status, 100 to 599."""

from __future__ import annotations

import pytest

from domain.errors import stream_error


@pytest.mark.parametrize(("code", "status"), [(99, 500), (100, 100), (101, 101), (598, 598), (599, 599), (600, 500)])
def test_a_code_is_the_status_only_from_100_to_599(code: int, status: int) -> None:
    assert stream_error({"error": {"code": code}}, "body").status == status
    assert stream_error({"code": code}, "body").status == status
