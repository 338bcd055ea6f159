"""Simulator: a switch's packet rate shared by every job aggregating there, and jobs' start-up time."""
from __future__ import annotations

import dataclasses

import pytest

from controller.policies import make_policy
from simulator import model, shared_switch
from simulator.calibration import Calibration, CalibrationError
from simulator.cluster import ClusterSpec
from simulator.engine import Simulation
from simulator.placement import make_placement
from simulator.trace import JobSpec, read_trace, write_trace

# A window-bound job on a switch with a processor-sharing software path: closed forms. Hosts are so fast that
# serialization and the line rate play no part; no propagation; a software round trip of S0. No BDP floor on the
# congestion window (on such hosts the BDP is far above every grant: tests of the floor below).
S0 = 1e-3
CAL = Calibration(ina_rtt_us=S0 * 1e6, cwnd_floor_bdp=False)
SLOTS, WORKERS = 10, 4
B = 1_000_000


def job(job_id=0, arrival=0.0, iterations=10, **kw) -> JobSpec:
    return JobSpec(job_id, arrival, WORKERS, B, iterations, (0.0,), slots=SLOTS, min_slots=1, **kw)


def run(jobs, cal, workers_per_rack=8):
    spec = ClusterSpec(racks=1, workers_per_rack=workers_per_rack, slots_per_switch=1024, host_gbps=1e6, uplink_gbps=1e6)
    return Simulation(spec, cal, make_policy("first-fit"), make_placement("pack"), check=True, follow_grant=True).run(jobs)


def rate(jobs_at_switch: int, cap: float | None) -> float:
    """K = sum_j m_j s_j / (S0 C); rho = K / (1 + K); each job's window rate = s payload / (S0 (1 + K))."""
    k = jobs_at_switch * WORKERS * SLOTS / (S0 * cap) if cap else 0.0
    return SLOTS * 128 / (S0 * (1 + k))


def per_call(r: float) -> float:
    return B / r + S0  # the last result's round trip (unstretched)


def test_stretch_is_the_fixed_point_of_the_load():
    cap = WORKERS * SLOTS / S0  # K = 1 for one job: rho = 1/2, the round trip doubles
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    assert shared_switch.shared_stretch(cal, None, [(SLOTS, WORKERS)]) == pytest.approx(2.0, rel=1e-9)
    assert shared_switch.shared_stretch(cal, None, [(SLOTS, WORKERS)] * 2) == pytest.approx(3.0, rel=1e-9)
    assert shared_switch.shared_stretch(CAL, None, [(SLOTS, WORKERS)]) == 1.0  # no shared capacity
    assert model.offered_pps(CAL, 128 * 100.0, 4) == pytest.approx(400.0)


def test_without_a_shared_capacity_two_jobs_run_as_if_alone():
    for r in run([job(0), job(1)], CAL).jobs:
        assert r.jct_s == pytest.approx(10 * per_call(rate(0, None)), rel=1e-6)


def test_two_jobs_stretch_each_other_round_trip():
    cap = WORKERS * SLOTS / S0
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    (alone,) = run([job(0)], cal).jobs
    assert alone.jct_s == pytest.approx(10 * per_call(rate(1, cap)), rel=1e-6)
    for r in run([job(0), job(1)], cal).jobs:
        assert r.jct_s == pytest.approx(10 * per_call(rate(2, cap)), rel=1e-6)


def test_the_load_changes_when_a_job_arrives_and_leaves():
    """Job 0 alone until job 1 arrives at t1; both loaded until job 1 (short) leaves; then job 0 alone again."""
    cap = WORKERS * SLOTS / S0
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    t_one, t_two = per_call(rate(1, cap)), per_call(rate(2, cap))
    result = run([job(0), job(1, arrival=3 * t_one, iterations=2)], cal)
    r0, r1 = sorted(result.jobs, key=lambda r: r.job_id)
    assert r1.jct_s == pytest.approx(2 * t_two, rel=1e-6)
    assert r0.jct_s == pytest.approx(3 * t_one + 2 * t_two + 5 * t_one, rel=1e-6)


def test_start_up_holds_slots_without_progress_or_load():
    """A job in its start-up holds its workers and slots but sends nothing: it does not load the switch, and its
    own completion is start-up + its run."""
    cap = WORKERS * SLOTS / S0
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    t_one, t_two = per_call(rate(1, cap)), per_call(rate(2, cap))
    startup = 4 * t_one
    result = run([job(0), job(1, iterations=2, startup_s=startup)], cal)
    r0, r1 = sorted(result.jobs, key=lambda r: r.job_id)
    assert r1.jct_s == pytest.approx(startup + 2 * t_two, rel=1e-6)
    assert r0.jct_s == pytest.approx(4 * t_one + 2 * t_two + 4 * t_one, rel=1e-6)
    assert r1.history[0][2] == SLOTS  # holds its slots from its start


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


# --- the senders' congestion window (a delay target) on a loaded shared switch ---------------------------------
# With CAL: the unloaded round trip is S0 = 1 ms, the target 1 ms + max(2 ms, 0.25 ms) = 3 ms, so the windows back off
# once the processor-sharing round trip S0 / (1 - rho) would exceed 3 ms: at rho* = 1 - S0 / 3 ms = 2/3.
RHO_STAR = 2 / 3


def test_cwnd_target_is_the_unloaded_round_trip_plus_the_allowance():
    assert shared_switch.cwnd_target(CAL) == pytest.approx(3e-3)
    far = dataclasses.replace(CAL, propagation_rtt_us=20_000.0)  # 21 ms: a quarter of it exceeds 2 ms
    assert shared_switch.cwnd_target(far) == pytest.approx(21e-3 * 1.25)
    assert shared_switch.cwnd_target(dataclasses.replace(CAL, congestion_window=False)) is None


def test_below_the_target_the_congestion_window_changes_nothing():
    cap = WORKERS * SLOTS / S0  # two jobs: stretch 3, round trip 3 ms = the target
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    assert shared_switch.shared_stretches(cal, None, [(SLOTS, WORKERS)] * 2) == pytest.approx([3.0, 3.0], rel=1e-9)


def test_above_the_target_the_windows_hold_the_load_at_rho_star():
    """Four jobs would stretch the round trip 5x (5 ms > 3 ms): the windows shrink until the load is rho* of the
    capacity, shared equally, every job's round trip at the target."""
    cap = WORKERS * SLOTS / S0
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    jobs = [(SLOTS, WORKERS)] * 4
    assert shared_switch.shared_stretch(cal, None, jobs) == pytest.approx(5.0, rel=1e-9)  # without the window
    assert shared_switch.shared_throughput(cal, None, jobs) == pytest.approx(RHO_STAR * cap, rel=1e-6)
    per_worker = RHO_STAR * cap / (4 * WORKERS)  # chunks/s: equal windows, one round trip
    stretches = shared_switch.shared_stretches(cal, None, jobs)
    for stretch in stretches:  # the time a slot is held: SLOTS chunks per SLOTS / per_worker seconds
        assert model.window_rtt(cal, None, stretch) == pytest.approx(SLOTS / per_worker, rel=1e-6)
    off = dataclasses.replace(cal, congestion_window=False)
    assert shared_switch.shared_stretches(off, None, jobs) == pytest.approx([5.0] * 4, rel=1e-9)


def test_a_job_below_its_fair_share_keeps_its_window_the_others_share_the_rest():
    """Max-min: a one-slot job is bounded by its own window at the target; the three others split what is left."""
    cap = WORKERS * SLOTS / S0
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    jobs = [(1, WORKERS)] + [(SLOTS, WORKERS)] * 3
    target = shared_switch.cwnd_target(cal)
    small = 1 / target  # chunks/s per worker: one slot per target round trip
    rest = (RHO_STAR * cap - WORKERS * small) / (3 * WORKERS)
    s = shared_switch.shared_stretches(cal, None, jobs)
    assert 1 / model.window_rtt(cal, None, s[0]) == pytest.approx(small, rel=1e-6)
    for stretch in s[1:]:
        assert SLOTS / model.window_rtt(cal, None, stretch) == pytest.approx(rest, rel=1e-6)


def test_the_engine_runs_jobs_at_their_congestion_window_share():
    cap = WORKERS * SLOTS / S0
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    per_worker = RHO_STAR * cap / (4 * WORKERS)
    for r in run([job(k) for k in range(4)], cal, workers_per_rack=16).jobs:  # all four at once
        assert r.jct_s == pytest.approx(10 * (B / (per_worker * 128) + S0), rel=1e-6)


def test_shared_capacity_inverts_the_model_on_the_probe():
    """What a ceiling probe measures is the model's throughput for the probe's jobs: inverting gives the capacity
    back, above the measured rate once the windows back off; None when the links alone explain the rate."""
    host = 1e6 / 8  # 1 Mbit/s links: 679 frames/s each
    cal = dataclasses.replace(CAL, propagation_rtt_us=20_000.0)
    jobs = [(64, 4)] * 4
    for cap in (3_000.0, 6_000.0, 9_000.0):
        measured = shared_switch.shared_throughput(dataclasses.replace(cal, switch_shared_pps=cap), host, jobs)
        assert measured < cap
        assert shared_switch.shared_capacity(cal, host, jobs, measured) == pytest.approx(cap, rel=1e-6)
    line = 16 * host * cal.ina_efficiency / 128
    assert shared_switch.shared_capacity(cal, host, jobs, line) is None


def test_calibration_checks_the_congestion_window_fields():
    assert Calibration(congestion_window=False).cwnd_queue_allowance_s is None
    with pytest.raises(CalibrationError, match="cwnd_queue_allowance_us"):
        Calibration(cwnd_queue_allowance_us=-1.0)
    with pytest.raises(CalibrationError, match="cwnd_allowance_share"):
        Calibration(cwnd_allowance_share=float("nan"))
    with pytest.raises(CalibrationError, match="cwnd_min_window"):
        Calibration(cwnd_min_window=0)


# --- jobs in their start-up taking part of a shared switch ----------------------------------------------------


def test_startup_load_is_the_workers_start_up_over_the_capacity():
    cal = dataclasses.replace(CAL, switch_shared_pps=1000.0, worker_startup_packets=500.0)
    assert shared_switch.startup_load(cal, 4, 2.0) == pytest.approx(4 * 500 / (2.0 * 1000))
    assert shared_switch.startup_load(dataclasses.replace(cal, switch_shared_pps=None), 4, 2.0) == 0.0  # nothing shared
    assert shared_switch.startup_load(cal, 4, 0.0) == 0.0


def test_starting_workers_take_capacity_from_the_running_jobs():
    """Job 1's 4 workers start for T with a share u = 4 w / (T C) = 1/2: job 0 runs on half the capacity
    meanwhile (the closed form of a job alone with half the capacity), then on all of it once job 1 runs too
    (the start-up in proportion to demand: ``startup_fair_share`` false)."""
    cap = WORKERS * SLOTS / S0
    t_start = 4 * per_call(rate(1, cap))
    cal = dataclasses.replace(CAL, switch_shared_pps=cap, worker_startup_packets=t_start * cap / 8,
                              startup_fair_share=False)
    half = dataclasses.replace(cal, switch_shared_pps=cap / 2, worker_startup_packets=0.0)
    assert shared_switch.shared_stretch(cal, None, [(SLOTS, WORKERS)], background=0.5) == pytest.approx(
        shared_switch.shared_stretch(half, None, [(SLOTS, WORKERS)]), rel=1e-9)
    slow = per_call(rate(1, cap / 2))  # job 0 alone on half the capacity
    result = run([job(0, iterations=2), job(1, iterations=1, startup_s=t_start)], cal)
    r0, r1 = sorted(result.jobs, key=lambda r: r.job_id)
    assert t_start > 2 * slow and r0.jct_s == pytest.approx(2 * slow, rel=1e-6)
    assert r1.jct_s == pytest.approx(t_start + per_call(rate(1, cap)), rel=1e-6)


def test_startup_share_fills_the_switch_fairly_among_claimants():
    """Water-filling over claimants: 5 running (4 workers and the switch) asking 1/5 of the capacity each against 4
    starting workers asking 1/8 each: every claimant gets 1/9, the start-up 4/9 (not the 1/2 it asks). Running jobs
    asking little (0.06 each) keep it all and the start-up takes the rest (0.7 of its 0.9)."""
    cal = dataclasses.replace(CAL, switch_shared_pps=1000.0)
    assert shared_switch.startup_share(cal, 0.5, 4, 1000.0, 5) == pytest.approx(4 / 9, rel=1e-9)
    assert shared_switch.startup_share(cal, 0.9, 4, 300.0, 5) == pytest.approx(0.7, rel=1e-9)
    assert shared_switch.startup_share(cal, 0.5, 4, 400.0, 5) == 0.5  # both fit: nothing taken beyond the idle share
    proportional = dataclasses.replace(cal, startup_fair_share=False)
    assert shared_switch.startup_share(proportional, 0.5, 4, 1000.0, 5) == 0.5


def test_running_jobs_keep_their_fair_share_while_workers_start():
    """The engine with the fair share: job 0 (4 workers and the switch, asking the whole capacity) against job 1's 4
    starting workers asking half: job 1 takes 4/9, job 0 runs on 5/9 of the capacity meanwhile."""
    cap = WORKERS * SLOTS / S0
    t_start = 4 * per_call(rate(1, cap))
    cal = dataclasses.replace(CAL, switch_shared_pps=cap, worker_startup_packets=t_start * cap / 8)
    slow = per_call(rate(1, cap * 5 / 9))
    r0, _ = sorted(run([job(0, iterations=2), job(1, iterations=1, startup_s=t_start)], cal).jobs, key=lambda r: r.job_id)
    assert t_start > 2 * slow and r0.jct_s == pytest.approx(2 * slow, rel=1e-6)


def test_calibration_checks_the_startup_fields():
    with pytest.raises(CalibrationError, match="worker_startup_packets"):
        Calibration(worker_startup_packets=-0.1)
    with pytest.raises(CalibrationError, match="startup_fair_share"):
        Calibration(startup_fair_share=1)


# --- per-job delay targets: a latecomer that first saw a loaded switch ---------------------------------------
LATE = dataclasses.replace(CAL, switch_shared_pps=10_000.0, cwnd_min_window=1, cwnd_latecomer=True)


def test_a_job_with_a_lower_target_shrinks_to_its_minimum_window():
    """A's senders saw 1 ms (target 3 ms), B's 2 ms (target 4 ms): the round trip settles at B's target, A keeps
    one chunk per round trip in flight, B takes what is left of rho* = 3/4 of the capacity."""
    state = shared_switch.shared_state(LATE, None, [(SLOTS, WORKERS)] * 2, paths=[1e-3, 2e-3])
    assert state.rtt == pytest.approx(4e-3)
    a_rate = 1 / 4e-3  # chunks/s per worker
    b_rate = (0.75 * 10_000 - WORKERS * a_rate) / WORKERS
    assert SLOTS / model.window_rtt(LATE, None, state.stretches[0]) == pytest.approx(a_rate, rel=1e-6)
    assert SLOTS / model.window_rtt(LATE, None, state.stretches[1]) == pytest.approx(b_rate, rel=1e-6)
    same = shared_switch.shared_state(LATE, None, [(SLOTS, WORKERS)] * 2, paths=[1e-3, 1e-3])
    assert same.stretches[0] == pytest.approx(same.stretches[1]) and same.rtt == pytest.approx(3e-3)


def test_the_engine_sets_a_latecomers_target_from_the_round_trip_it_first_sees():
    """Job 0 alone is held at its 3 ms target (rho* = 2/3: 1667 chunks/s per worker); job 1 arrives then, so its
    senders' shortest round trip is 3 ms and its target 5 ms: it runs at (0.8 C - job 0 at one chunk per 5 ms) / 4."""
    alone = (2 / 3) * 10_000 / WORKERS
    late = (0.8 * 10_000 - WORKERS / 5e-3) / WORKERS
    t1 = 2 * (B / (alone * 128) + S0)
    result = run([job(0), job(1, arrival=t1, iterations=2)], LATE)
    r0, r1 = sorted(result.jobs, key=lambda r: r.job_id)
    assert r1.jct_s == pytest.approx(2 * (B / (late * 128) + S0), rel=1e-6)
    assert r0.jct_s > 10 * (B / (alone * 128) + S0) + r1.jct_s * 0.5  # job 0 nearly stops meanwhile


def test_without_latecomer_targets_a_late_job_shares_equally():
    """The default (cwnd_latecomer false, as the testbed's staggered probe shows): job 1 arrives while job 0 runs,
    yet both back off at the unloaded path's target (3 ms: rho* = 2/3), sharing it equally: each at a third of C
    once both run, as two jobs started together."""
    cal = dataclasses.replace(LATE, cwnd_latecomer=False)
    alone = (2 / 3) * 10_000 / WORKERS
    t1 = 2 * (B / (alone * 128) + S0)
    together = run([job(0, iterations=2), job(1, iterations=2)], cal)
    late = run([job(0), job(1, arrival=t1, iterations=2)], cal)
    _r0, r1 = sorted(late.jobs, key=lambda r: r.job_id)
    assert r1.jct_s == pytest.approx(max(r.jct_s for r in together.jobs), rel=1e-6)
    assert r1.jct_s == pytest.approx(2 * (B / ((1 / 3) * 10_000 / WORKERS * 128) + S0), rel=1e-6)
    with pytest.raises(CalibrationError, match="cwnd_latecomer"):
        Calibration(cwnd_latecomer="yes")


def test_startup_load_counts_the_warm_up_packets_over_the_capacity():
    """A job that all-reduces within its start-up (a warm-up) sends g gradient packets over startup_s: g / (startup_s
    C) of the capacity, on top of its workers' start-up."""
    cal = dataclasses.replace(CAL, switch_shared_pps=5000.0, worker_startup_packets=2500.0)
    assert shared_switch.startup_load(cal, 4, 2.0, gradients=2048) == pytest.approx(1.0 + 2048 / (2.0 * 5000.0))
    bare = dataclasses.replace(cal, worker_startup_packets=0.0)
    assert shared_switch.startup_load(bare, 4, 2.0, gradients=2048) == pytest.approx(2048 / (2.0 * 5000.0))
    assert shared_switch.startup_load(CAL, 4, 2.0, gradients=2048) == 0.0  # no shared capacity: nothing to load


def test_a_warm_up_within_the_start_up_slows_the_running_job():
    """Job 1 starts for T and runs one warm-up all-reduce meanwhile (startup_iterations 1): its packets, spread over
    T, take a share B / payload x m / (T C) of the capacity from job 0; without the warm-up job 0 runs alone."""
    cap = WORKERS * SLOTS / S0
    cal = dataclasses.replace(CAL, switch_shared_pps=cap)
    t_start = 8 * per_call(rate(1, cap))
    quiet = run([job(0, iterations=2), job(1, iterations=1, startup_s=t_start)], cal)
    warm = run([job(0, iterations=2), job(1, iterations=1, startup_s=t_start, startup_iterations=1)], cal)
    share = WORKERS * -(-B // 128) / (t_start * cap)  # ceil(B / payload) chunks per worker
    slowed = dataclasses.replace(cal, switch_shared_pps=cap * (1 - share))
    r_quiet, r_warm = (min(r.jobs, key=lambda j: j.job_id) for r in (quiet, warm))
    assert r_quiet.jct_s == pytest.approx(2 * per_call(rate(1, cap)), rel=1e-6)
    assert r_warm.jct_s == pytest.approx(2 * per_call(rate(1, slowed.switch_shared_pps)), rel=1e-6)


def test_startup_iterations_column_round_trips_and_is_checked(tmp_path):
    path = tmp_path / "trace.csv"
    write_trace(path, [job(0, startup_s=1.0, startup_iterations=1), job(1)])
    assert [j.startup_iterations for j in read_trace(path)] == [1, 0]
    with pytest.raises(ValueError, match="startup_iterations"):
        job(2, startup_iterations=-1)


# --- the congestion window's floor at the link's BDP (host_agent/congestion.py) --------------------------------
# 1 Mbit/s hosts, 20 ms of propagation: a frame of 184 bytes takes 1.472 ms, the window round trip is
# S0 + 20 ms + 2 x 1.472 ms, and the link's BDP is (125,000 x efficiency) B/s x that round trip / 128 B.
SLOW_HOST = 125_000.0


def test_the_least_window_is_the_links_bdp_capped_by_the_grant():
    cal = dataclasses.replace(CAL, propagation_rtt_us=20_000.0, cwnd_floor_bdp=True)
    base = model.window_rtt(cal, SLOW_HOST)
    bdp = SLOW_HOST * cal.ina_efficiency * base / cal.payload_bytes
    assert 10 < bdp < 32
    assert shared_switch.least_window(cal, SLOW_HOST, 64, base) == pytest.approx(bdp)
    assert shared_switch.least_window(cal, SLOW_HOST, 8, base) == 8  # a grant below the BDP: the grant
    assert shared_switch.least_window(cal, float("inf"), 64, base) == cal.cwnd_min_window  # no link: no BDP
    off = dataclasses.replace(cal, cwnd_floor_bdp=False)
    assert shared_switch.least_window(off, SLOW_HOST, 64, base) == cal.cwnd_min_window


def test_with_the_floor_a_grant_at_the_bdp_never_backs_off():
    """Four jobs granted at most their BDP on a loaded switch: with the floor they keep their grants (the plain
    processor-sharing fixed point); without it they back off to the delay target."""
    cal = dataclasses.replace(CAL, propagation_rtt_us=20_000.0, cwnd_floor_bdp=True)
    base = model.window_rtt(cal, SLOW_HOST)
    grant = int(SLOW_HOST * cal.ina_efficiency * base / cal.payload_bytes)  # just under the BDP
    jobs = [(grant, WORKERS)] * 4
    loaded = dataclasses.replace(cal, switch_shared_pps=4 * WORKERS * grant / (base * 20.0))  # 20x overloaded
    stretch = shared_switch.shared_stretch(loaded, SLOW_HOST, jobs)  # every job at its grant
    assert model.window_rtt(loaded, SLOW_HOST, stretch) > shared_switch.cwnd_target(loaded, SLOW_HOST)
    assert shared_switch.shared_stretches(loaded, SLOW_HOST, jobs) == pytest.approx([stretch] * 4, rel=1e-9)
    backed = shared_switch.shared_state(dataclasses.replace(loaded, cwnd_floor_bdp=False), SLOW_HOST, jobs)
    assert backed.rtt < model.window_rtt(loaded, SLOW_HOST, stretch)  # without the floor the windows back off


def test_calibration_checks_cwnd_floor_bdp():
    with pytest.raises(CalibrationError, match="cwnd_floor_bdp"):
        Calibration(cwnd_floor_bdp="yes")
