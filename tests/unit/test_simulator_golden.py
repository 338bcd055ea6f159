"""The simulator's golden traces: every pinned scenario (tests/unit/sim_golden.py) gives each job the same
allocation history and the same start and completion times, within 1e-9 relative."""
from __future__ import annotations

import pytest

from tests.unit.sim_golden import compare, load_fixture, scenarios

PINNED = load_fixture()
SCENARIOS = list(scenarios())


def test_every_scenario_is_pinned():
    assert sorted(s.name for s in SCENARIOS) == sorted(PINNED)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_golden_trace(scenario):
    problems = compare(PINNED[scenario.name], scenario.run())
    assert not problems, f"{len(problems)} job(s) differ; first: {problems[:3]}"
