"""Simulator: two-level aggregation trees (ToRs, then the spine), their uplink traffic and spine memory."""
from __future__ import annotations

import pytest

from controller.policies import make_policy
from simulator import model
from simulator.calibration import Calibration
from simulator.cluster import ClusterSpec
from simulator.engine import Simulation
from simulator.placement import make_placement
from simulator.report import summarize
from simulator.trace import JobSpec

GB = 1e9 / 8
CAL = Calibration(ina_rtt_us=10.0, propagation_rtt_us=20.0)
HOST, UPLINK = 10 * GB, 100 * GB
B = 10_000_000


def job(job_id=0, arrival=0.0, workers=8, iterations=5, **kw) -> JobSpec:
    return JobSpec(job_id, arrival, workers, B, iterations, (0.0,), **kw)


def run(jobs, *, racks=2, per_rack=4, spine=1024, slots=1024, placement="pack", policy="first-fit", ina=1.0, **kw):
    spec = ClusterSpec(racks=racks, workers_per_rack=per_rack, slots_per_switch=slots, host_gbps=10.0,
                       uplink_gbps=100.0, spine_slots=spine, ina_fraction=ina)
    return Simulation(spec, CAL, make_policy(policy), make_placement(placement), check=True, **kw).run(jobs)


def test_uplink_bytes_per_all_reduce():
    assert model.uplink_bytes(CAL, "tree", B, [4, 4]) == pytest.approx(B * 184 / 128)
    assert model.uplink_bytes(CAL, "tree", B, [1, 1, 1, 1]) == pytest.approx(B * 184 / 128)  # one stream per rack
    assert model.uplink_bytes(CAL, "rina", B, [2, 2, 2, 2]) == pytest.approx(2 * 3 / 4 * B)
    assert model.uplink_bytes(CAL, "ring", B, [4, 4]) == pytest.approx(2 * 7 / 8 * B)
    assert model.uplink_bytes(CAL, "tree", B, [8]) == 0.0


def test_a_job_across_two_racks_runs_as_a_tree_at_the_closed_form_time():
    (r,) = run([job()]).jobs
    window = model.tree_window_rtt(CAL, HOST, UPLINK)
    slots = r.history[0][2]
    assert r.history[0][1] == "tree" and slots == r.slots_requested
    rate = min(HOST * 128 / 184, slots * 128 / window)
    assert r.jct_s == pytest.approx(5 * (B / rate + 2 * (10e-6 + 20e-6)), rel=1e-9)
    assert r.uplink_bytes == pytest.approx(5 * B * 184 / 128)


def test_with_its_bdp_of_slots_the_tree_is_within_ten_percent_of_one_switch():
    (tree,) = run([job()]).jobs
    (single,) = run([job()], racks=1, per_rack=8).jobs
    assert single.history[0][1] == "ina"
    assert tree.jct_s <= 1.10 * single.jct_s


def test_without_spine_slots_the_job_uses_rina_and_without_ina_the_ring():
    (rina,) = run([job()], spine=0).jobs
    assert rina.history[0][1] == "rina"
    assert rina.uplink_bytes == pytest.approx(5 * B)  # r = 2: 2(r-1)/r = 1
    (ring,) = run([job()], ina=0.0).jobs
    assert ring.history[0][1] == "ring"
    (tree,) = run([job()]).jobs
    assert tree.jct_s < rina.jct_s and tree.jct_s < ring.jct_s


def test_spine_memory_is_shared_and_a_job_without_spine_slots_falls_back_to_rina():
    """Two jobs spanning the same two racks, a spine pool for one of them: the first is a tree, the second Rina."""
    request = run([job()]).jobs[0].slots_requested
    jobs = [job(0, workers=4), job(1, workers=4)]
    result = run(jobs, racks=2, per_rack=4, spine=request, placement="spread")
    backends = {r.job_id: r.history[0][1] for r in result.jobs}
    assert backends == {0: "tree", 1: "rina"}
    assert summarize(result)["spine_slot_utilisation"] > 0


def test_packing_a_job_under_one_tor_leaves_the_spine_free():
    jobs = [job(0, workers=4, iterations=3), job(1, workers=4, iterations=3)]
    packed = summarize(run(jobs, per_rack=4, placement="ina-aware"))
    spread = summarize(run(jobs, per_rack=4, placement="spread"))
    assert packed["spine_slot_utilisation"] == 0.0 and packed["uplink_bytes_total"] == 0.0
    assert spread["spine_slot_utilisation"] > 0.0 and spread["uplink_bytes_total"] > 0.0


def test_one_worker_per_rack_sends_straight_to_the_spine():
    """Spread one worker per rack: no ToR holds slots, the spine alone aggregates the 4 workers."""
    (r,) = run([job(workers=4)], racks=4, per_rack=2, placement="spread").jobs
    assert r.racks == 4 and r.history[0][1] == "tree"
    assert r.uplink_bytes == pytest.approx(5 * B * 184 / 128)
