"""Fixtures the contract tests share (`client_kind`, which runs a test over both clients, is in
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.fake_server import FakeServer


@pytest.fixture
def server() -> Iterator[FakeServer]:
    """A fake server of its own for each test, stopped (and its threads joined) after it."""
    with FakeServer() as srv:
        yield srv
