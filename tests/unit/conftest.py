"""Fixtures of the unit tier."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from adapters.fake_server import ScriptedTransport
from app.client import Client
from scripted_client import scripted_clients


@pytest.fixture
def client_for() -> Iterator[Callable[..., tuple[Client, ScriptedTransport]]]:
    """A sync client on the scripted transport and a fake clock (see `scripted_client`)."""
    yield from scripted_clients()
