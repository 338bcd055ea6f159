"""Test tiers by folder: tests/unit, tests/packet, tests/integration, tests/bmv2 get their marker automatically."""
from __future__ import annotations

import os
import shutil

import pytest

_TIERS = ("unit", "packet", "integration", "bmv2")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
        if "integration" in parts and os.geteuid() != 0:
            item.add_marker(pytest.mark.skip(reason="integration tests need root (network namespaces)"))
        if "bmv2" in parts and shutil.which("simple_switch_grpc") is None:
            item.add_marker(pytest.mark.skip(reason="simple_switch_grpc is not on PATH"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--target",
        default=os.environ.get("INA_TARGET", "model"),
        choices=("model", "ina-switch", "bmv2"),
        help="where the packet-level suite runs: the in-process model, an ina-switch process or BMv2 (default: model)",
    )


@pytest.fixture
def target(request: pytest.FixtureRequest):
    """A fresh switch target for one test (see tests/targets.py)."""
    from tests import targets

    kind = request.config.getoption("--target")
    if kind == "model":
        t = targets.ModelTarget()
    else:
        t = targets.process_target(kind, request)
    try:
        yield t
    finally:
        t.close()
