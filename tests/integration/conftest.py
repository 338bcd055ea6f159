"""Fixtures for integration tests (root): network namespaces that are always removed."""
from __future__ import annotations

import pytest

from topologies.netns import Network, sweep_stale


@pytest.fixture
def network(request: pytest.FixtureRequest) -> Network:
    """A ``Network`` for one test: add namespaces and veth pairs; all are removed at teardown, pass or fail,
    after the processes it tracks are stopped (SIGTERM, then SIGKILL)."""
    sweep_stale()
    net = Network("t")
    request.addfinalizer(net.close)
    return net
