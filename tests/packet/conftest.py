"""The packet-level suite runs on every target this machine has, in this process: the model (``packet`` tier),
the ina-switch process (``integration``: root) and BMv2 (``bmv2``: simple_switch_grpc and p4c on PATH).

``target_kind`` is parametrised over the three, for the whole session, so pytest runs every test of the suite on
the model, then on ina-switch, then on BMv2, each switch process started once and given a fresh pipeline per
test (tests/integration/switch_process.py). ``pytest tests/packet -m packet`` keeps to the model, ``-m
integration`` to ina-switch, ``-m bmv2`` to BMv2.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.targets import ModelTarget, Target

TARGETS = {"model": "packet", "ina-switch": "integration", "bmv2": "bmv2"}  # target -> its tier


@pytest.fixture(scope="session", params=[pytest.param(kind, marks=getattr(pytest.mark, tier), id=kind)
                                         for kind, tier in TARGETS.items()])
def target_kind(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], Target]]:
    """``make(index)``: a fresh target of this kind (index > 0: another switch, for chains and trees)."""
    kind = request.param
    if kind == "model":
        yield lambda index: ModelTarget()
        return
    from tests.integration.switch_process import SwitchProcesses

    program = request.getfixturevalue("p4c_build") / "ina.json" if kind == "bmv2" else None
    processes = SwitchProcesses(kind, tmp_path_factory.mktemp(kind), program)
    try:
        yield processes.target
    finally:
        processes.close()


@pytest.fixture
def target(target_kind: Callable[[int], Target]) -> Iterator[Target]:
    """A fresh switch target for one test (tests/targets.py)."""
    t = target_kind(0)
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def switches(target_kind: Callable[[int], Target]) -> Iterator[Callable[[int], list[Target]]]:
    """``switches(n)``: n more fresh switch targets of the test's kind, closed at the end of the test.

    Frames between them are carried by the test (tests/packet/test_chains.py), so the same cases run on the
    model, on ina-switch and on BMv2; process targets are switches of their own, on namespaces of their own.
    """
    made: list[Target] = []

    def make(n: int) -> list[Target]:
        for _ in range(n):
            made.append(target_kind(len(made)))
        return made[-n:]

    try:
        yield make
    finally:
        errors = []
        for t in made:
            try:
                t.close()
            except Exception as e:  # close every switch, then report the first failure  # noqa: BLE001
                errors.append(e)
        if errors:
            raise errors[0]
