"""``ina-agent`` exits by itself once its work is done (root): 30 jobs in a row against the real controller,
through ina-switch in Mininet, and not one agent needs the runner's stop-after-results fallback.

The bound the runner gives an agent between writing its results and exiting (``EXIT_GRACE``, 15 s) is
generous: this is a check that agents exit, not a timing claim.
"""
from __future__ import annotations

import pytest

from topologies.experiments import testbed
from topologies.experiments.testbed import AgentJob
from topologies.topos import StarTopo

RUNS = 30


@pytest.mark.slow
def test_thirty_agent_runs_in_a_row_all_exit_by_themselves(tmp_path) -> None:
    with testbed.Testbed(StarTopo(2, bw=20), run_dir=tmp_path, agent_timeout=120) as bed:
        for k in range(RUNS):
            backend = ("ina", "auto")[k % 2]  # a fixed INA grant, and one followed live over WatchJob
            job = AgentJob(f"exit-{k}", ("h1", "h2"), "allreduce", backend=backend, requested_slots=4,
                           udp_port=47200 + k, args=("--elements", "512", "--iterations", "1", "--warmup", "0",
                                                     "--check"))
            workers = bed.run_jobs([job])[job.name]
            assert [w["check"] for w in workers] == [True, True]
            assert not any(w["runner"]["stopped_after_results"] for w in workers), f"run {k}: {bed.lingered}"
        assert bed.lingered == []
