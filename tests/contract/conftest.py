"""Fixtures the contract tests share.

`client_kind` runs a test once over each client: "sync" (`app.client.Client`) and "async"
(`app.async_client.AsyncClient` behind `async_bridge.AsyncBridge`). A test module asks for it
with `pytest.mark.usefixtures("client_kind")`; every client the `client_support` helpers build in
that test is then of that kind. A test marked `sync_only("why")` runs over the sync client only,
and its async run is reported as skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.fake_server import FakeServer
from client_support import CLIENT_KINDS
from client_support import client_kind as building


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sync_only(reason): runs over the sync client only, and says why")


@pytest.fixture(params=CLIENT_KINDS)
def client_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """The kind of client this run of the test builds. The mark is read from the test's own node,
    so a mark on one `pytest.param` of a parametrised test concerns that run alone."""
    kind: str = request.param
    only = request.node.get_closest_marker("sync_only")
    if kind != "sync" and only is not None:
        pytest.skip(f"sync client only: {only.args[0]}")
    with building(kind):
        yield kind


@pytest.fixture
def server() -> Iterator[FakeServer]:
    """A fake server of its own for each test, stopped (and its threads joined) after it."""
    with FakeServer() as srv:
        yield srv
