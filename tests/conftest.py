"""Test tiers: each test has exactly one, given by what it needs (README, "Test tiers").

- ``unit``: nothing but Python: no socket, thread, process or sleep (enforced: ``tests/support/isolation.py``);
- ``local``: loopback sockets, threads, processes without namespaces (no root);
- ``packet``: the packet-level suite on the in-process model;
- ``integration``: processes in network namespaces (root), the packet suite on ina-switch among them;
- ``bmv2``: BMv2 ``simple_switch_grpc`` and p4c (where they are on PATH), the packet suite on BMv2 among them.

A test's tier is its folder (``tests/<tier>/``) unless it carries a tier marker itself: a test of the packet
suite gets its target's tier (``tests/packet/conftest.py``), a test that needs more than its folder's tier is
marked with it. ``slow`` (anything over about 30 s) is orthogonal: ``make test`` leaves it out, ``make
test-slow`` runs it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

TIERS = ("unit", "local", "packet", "integration", "bmv2")
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def tier_of(item: pytest.Item) -> str:
    """The item's tier marker if it has one, else its folder's."""
    marked = [t for t in TIERS if item.get_closest_marker(t) is not None]
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid}: one tier per test, not {marked}")
    if marked:
        return marked[0]
    folder = item.path.relative_to(TESTS).parts[0]
    if folder not in TIERS:
        raise pytest.UsageError(f"{item.nodeid}: a test lives in tests/<tier>/ ({', '.join(TIERS)}) or is marked with its tier")
    return folder


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each test's tier marker (before ``-m`` selects), and its skip where this machine cannot run that tier."""
    tier = tier_of(item)
    item.add_marker(getattr(pytest.mark, tier))
    if tier == "integration" and os.geteuid() != 0:
        item.add_marker(pytest.mark.skip(reason="integration tests need root (network namespaces)"))
    if tier == "bmv2" and shutil.which("simple_switch_grpc") is None:
        item.add_marker(pytest.mark.skip(reason="simple_switch_grpc is not on PATH"))


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests by target
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The cheapest tiers first (a stable sort): a broken unit test is reported before any namespace is built."""
    items.sort(key=lambda item: TIERS.index(tier_of(item)))


# --- the unit tier's rule -------------------------------------------------------------------------------------
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _confined_if_unit(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _confined_if_unit(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    with _confined_if_unit(item):
        return (yield)


def _confined_if_unit(item: pytest.Item):
    from contextlib import nullcontext

    from tests.support.isolation import confined

    return confined() if item.get_closest_marker("unit") is not None else nullcontext()


# --- p4c's build of p4src/ina.p4, once per session ---------------------------------------------------------------
@pytest.fixture(scope="session")
def p4c_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder with ``ina.json`` and ``ina.p4info.txt`` as p4c-bm2-ss compiles ``p4src/ina.p4`` (skips without p4c)."""
    if shutil.which("p4c-bm2-ss") is None:
        pytest.skip("p4c-bm2-ss is not on PATH")
    out = tmp_path_factory.mktemp("p4c")
    subprocess.run(["p4c-bm2-ss", "--p4v", "16", "--p4runtime-files", str(out / "ina.p4info.txt"),
                    "-o", str(out / "ina.json"), str(ROOT / "p4src" / "ina.p4")], check=True)
    yield out

