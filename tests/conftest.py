"""Fixtures every tier shares.

`client_kind` runs a test once over each client: `SYNC` (`app.client.Client`) and `ASYNC`
(`app.async_client.AsyncClient` behind `async_bridge.AsyncBridge`), the `client_support.Kind` it
yields building the test's clients and probes (`client_kind.client_for(server)`,
`client_kind.client_of(container)`). A module that wants every test run over both, also those that
build no client, says `pytestmark = pytest.mark.usefixtures("client_kind")`. A test marked
`sync_only("why")` runs over the sync client only, and its async run is reported as skipped with
the reason.
"""

from __future__ import annotations

import pytest

from client_support import CLIENT_KINDS, Kind


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sync_only(reason): runs over the sync client only, and says why")


@pytest.fixture(params=CLIENT_KINDS, ids=str)
def client_kind(request: pytest.FixtureRequest) -> Kind:
    """The kind of client this run of the test builds. The mark is read from the test's own node,
    so a mark on one `pytest.param` of a parametrised test concerns that run alone."""
    kind: Kind = request.param
    only = request.node.get_closest_marker("sync_only")
    if kind.is_async and only is not None:
        pytest.skip(f"sync client only: {only.args[0]}")
    return kind
