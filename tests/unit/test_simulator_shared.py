"""Simulator: a switch's packet rate shared by every job aggregating there, and jobs' start-up time."""
from __future__ import annotations

import dataclasses

import pytest

from controller.policies import make_policy
from simulator import model
from simulator.calibration import Calibration, CalibrationError
from simulator.cluster import ClusterSpec
from simulator.engine import Simulation
from simulator.placement import make_placement
from simulator.trace import JobSpec, read_trace, write_trace

pytestmark = pytest.mark.unit

GB = 1e9 / 8
HOST = 1 * GB  # 1 Gbit/s hosts keep the numbers small
# Ring is made hopeless so INA is always the faster backend; 0 software round trip keeps formulas short.
CAL = Calibration(ina_rtt_us=10.0, ring_goodput_fraction=0.05)
LINE = HOST * 128 / 184  # INA payload rate at line rate
WINDOW = 10e-6 + 2 * 184 / HOST
SAT = model.saturating_slots(CAL, LINE, HOST)  # slots that reach line rate


def job(job_id=0, arrival=0.0, workers=4, nbytes=1_000_000, iterations=10, **kw) -> JobSpec:
    return JobSpec(job_id, arrival, workers, nbytes, iterations, (0.0,), slots=SAT, min_slots=1, **kw)


def run(jobs, cal, *, slots=1024):
    spec = ClusterSpec(racks=1, workers_per_rack=8, slots_per_switch=slots, host_gbps=1.0, uplink_gbps=1.0)
    return Simulation(spec, cal, make_policy("first-fit"), make_placement("pack"), check=True).run(jobs)


def per_call(rate: float, nbytes: float = 1_000_000) -> float:
    return nbytes / rate + 10e-6


def test_shared_share_is_capacity_over_offered_load():
    assert model.shared_share(None, 1e9) == 1.0
    assert model.shared_share(1000.0, 800.0) == 1.0
    assert model.shared_share(1000.0, 4000.0) == pytest.approx(0.25)
    assert model.offered_pps(CAL, 128 * 100.0, 4) == pytest.approx(400.0)


def test_without_a_shared_bound_two_jobs_run_as_if_alone():
    result = run([job(0), job(1)], CAL)
    for r in result.jobs:
        assert r.jct_s == pytest.approx(10 * per_call(LINE), rel=1e-9)


def test_two_jobs_at_line_rate_share_a_switch_that_serves_one():
    """Each job offers 4 x LINE / payload gradients/s; the switch serves exactly that much in total: both
    run at half their rate for as long as both run."""
    offered_one = 4 * LINE / 128
    cal = dataclasses.replace(CAL, switch_shared_pps=offered_one)
    result = run([job(0), job(1)], cal)
    for r in result.jobs:
        assert r.jct_s == pytest.approx(10 * per_call(LINE / 2), rel=1e-9)


def test_a_job_alone_below_the_shared_bound_is_not_slowed():
    cal = dataclasses.replace(CAL, switch_shared_pps=4 * LINE / 128 * 1.01)
    (r,) = run([job(0)], cal).jobs
    assert r.jct_s == pytest.approx(10 * per_call(LINE), rel=1e-9)


def test_the_share_changes_when_a_job_arrives_and_leaves():
    """Job 0 alone at line rate until job 1 arrives at t1; both at half rate until job 1 (short) leaves; then
    job 0 at line rate again."""
    cal = dataclasses.replace(CAL, switch_shared_pps=4 * LINE / 128)
    t_full = per_call(LINE)
    t_half = per_call(LINE / 2)
    t1 = 3 * t_full  # job 0 has done 3 of its 10 calls alone
    result = run([job(0), job(1, arrival=t1, iterations=2)], cal)
    r0, r1 = sorted(result.jobs, key=lambda r: r.job_id)
    assert r1.jct_s == pytest.approx(2 * t_half, rel=1e-9)
    # job 0: 3 calls alone, 2 * t_half / t_half = 2 calls shared, 5 calls alone again
    assert r0.jct_s == pytest.approx(3 * t_full + 2 * t_half + 5 * t_full, rel=1e-9)


def test_start_up_holds_slots_without_progress_or_load():
    """A job in its start-up holds its workers and slots but sends nothing: it does not slow the others, and its
    own completion is start-up + its run."""
    cal = dataclasses.replace(CAL, switch_shared_pps=4 * LINE / 128)
    t_full, t_half = per_call(LINE), per_call(LINE / 2)
    startup = 4 * t_full
    result = run([job(0, iterations=10), job(1, iterations=2, startup_s=startup)], cal)
    r0, r1 = sorted(result.jobs, key=lambda r: r.job_id)
    assert r1.jct_s == pytest.approx(startup + 2 * t_half, rel=1e-9)
    assert r0.jct_s == pytest.approx(4 * t_full + 2 * t_half + 4 * t_full, rel=1e-9)
    assert r1.history[0][2] == SAT  # holds its slots from its start


def test_start_up_column_round_trips_and_is_checked(tmp_path):
    jobs = [job(0, startup_s=1.25), job(1)]
    path = tmp_path / "trace.csv"
    write_trace(path, jobs)
    assert [j.startup_s for j in read_trace(path)] == [1.25, 0.0]
    with pytest.raises(ValueError, match="startup_s"):
        job(2, startup_s=-1.0)


def test_calibration_checks_the_shared_bound():
    assert Calibration(switch_shared_pps=12_000).switch_shared_pps == 12_000
    with pytest.raises(CalibrationError, match="switch_shared_pps"):
        Calibration(switch_shared_pps=0)
