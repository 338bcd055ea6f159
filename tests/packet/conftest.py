"""Several switches in one test (chains across switches): each on a network of its own for process targets."""
from __future__ import annotations

import pytest


@pytest.fixture
def switches(request: pytest.FixtureRequest):
    """``switches(n)``: n fresh switch targets of the session's ``--target``, closed at the end of the test.

    Frames between them are carried by the test (tests/packet/test_chains.py), so the same cases run on the
    model, on ina-switch and on BMv2. Process targets get one namespace set per switch index, made once.
    """
    from tests import targets

    kind = request.config.getoption("--target")
    made: list = []

    def make(n: int) -> list:
        for i in range(n):
            if kind == "model":
                made.append(targets.ModelTarget())
            else:
                made.append(_process_target(kind, request, i))
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


def _process_target(kind: str, request: pytest.FixtureRequest, index: int):
    """Switch ``index`` of a test: index 0 is the suite's usual switch network, the others have their own."""
    from tests.integration.switch_process import ProcessTarget, process_target

    if index == 0:
        return process_target(kind, request)
    config = request.config
    nets = getattr(config, "_ina_chain_networks", None)
    if nets is None:
        nets = config._ina_chain_networks = {}
    net = nets.get(index)
    if net is None:
        from topologies.netns import Network
        from topologies.switch_process import SwitchNetwork

        network = Network(f"pk{index}")
        config.add_cleanup(network.close)
        net = nets[index] = SwitchNetwork(network, ProcessTarget.ports)
    log_dir = request.getfixturevalue("tmp_path") / f"s{index}"
    log_dir.mkdir(exist_ok=True)
    return ProcessTarget(net, log_dir, kind)
