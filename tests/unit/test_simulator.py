"""Cluster simulator: closed-form cases, invariants at every event, determinism, model and placement units."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from controller.policies import POLICIES, SizedPolicy, make_policy, register_policy
from inaproto.config import ConfigError, load, to_toml
from simulator import model
from simulator.calibration import Calibration, CalibrationError
from simulator.cluster import ClusterSpec
from simulator.config import SimConfig
from simulator.engine import InvariantError, Simulation
from simulator.placement import PLACEMENTS, RackView, make_placement
from simulator.trace import JobSpec, SyntheticConfig, generate_trace

CAL = Calibration()  # defaults: rtt 5 us, 128 B payload in 184 B frames, ring at 94 % of line rate
GB = 1e9 / 8  # bytes per second in one Gbit/s


WINDOW = 5e-6 + 2 * 184 / (100 * GB)  # a slot's round trip: rtt + one frame's serialization each way (100G)


def job(job_id=0, arrival=0.0, workers=4, nbytes=100_000_000, iterations=100, compute=0.05, **kw) -> JobSpec:
    return JobSpec(job_id, arrival, workers, nbytes, iterations, (compute,), **kw)


def simulate(jobs, *, policy="first-fit", placement="pack", cal=CAL, **cluster):
    spec = ClusterSpec(**{"racks": 1, "workers_per_rack": 8, **cluster})
    sim = Simulation(spec, cal, make_policy(policy), make_placement(placement), check=True)
    return sim.run(jobs)


# --- closed-form cases ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_one_job_alone_runs_at_line_rate_ina(policy):
    """Alone, a job gets the window that saturates its link: t = B * frame / (payload * bw) + rtt."""
    result = simulate([job()], policy=policy)
    (r,) = result.jobs
    bw = 100 * GB
    comm = 100e6 * 184 / (128 * bw) + 5e-6
    assert r.jct_s == pytest.approx(100 * (0.05 + comm), rel=1e-9)
    window = 5e-6 + 2 * 184 / bw  # the round trip a slot is held: software rtt + one frame's serialization each way
    assert r.history == ((0.0, "ina", math.ceil(bw * 128 / 184 * window / 128)),)
    assert r.slots_requested == 342 and r.queue_s == 0


@pytest.mark.parametrize("policy", ["equal", "weighted"])
def test_two_identical_jobs_share_half_the_memory_each(policy):
    """Two jobs, each asking the whole pool: each holds half, window-bound: t = B / (S/2 * payload / rtt) + rtt."""
    pool = 200
    jobs = [job(0, slots=pool, min_slots=10), job(1, slots=pool, min_slots=10)]
    cal = dataclasses.replace(CAL, ring_goodput_fraction=0.05)  # make ring hopeless so INA is always chosen
    result = simulate(jobs, policy=policy, slots_per_switch=pool, cal=cal)
    rate = (pool // 2) * 128 / WINDOW
    expected = 100 * (0.05 + 100e6 / rate + 5e-6)
    for r in result.jobs:
        assert r.jct_s == pytest.approx(expected, rel=1e-9)
        assert r.history[0] == (0.0, "ina", pool // 2)  # (the survivor may get the pool back as it finishes)


def test_plain_switches_give_ring_all_reduce():
    result = simulate([job(workers=8)], ina_fraction=0.0)
    (r,) = result.jobs
    ring = 2 * 7 / 8 * 100e6 / (100 * GB * 0.94) + 2 * 7 * 10e-6
    assert r.jct_s == pytest.approx(100 * (0.05 + ring), rel=1e-9)
    assert r.history == ((0.0, "ring", 0),) and r.slots_requested == 0


def test_multi_rack_job_uses_rina():
    """16 workers over two INA racks: ring between the racks over min(cross-rack, INA) rate."""
    result = simulate([job(workers=16)], racks=2)
    (r,) = result.jobs
    rate = min(100 * GB * 0.94, 400 * GB * 0.94, 100 * GB * 128 / 184)
    rina = 2 * 1 / 2 * 100e6 / rate + 2 * 1 * 10e-6 + 5e-6
    assert r.racks == 2 and r.history[0][1] == "rina"
    assert r.jct_s == pytest.approx(100 * (0.05 + rina), rel=1e-9)


def test_slot_loss_mid_run_is_charged_from_that_moment():
    """Job A alone until B arrives at T; from then on both hold half: A's finish is T + rest * t_half."""
    cal = dataclasses.replace(CAL, ring_goodput_fraction=0.05)
    pool, T = 200, 3.0
    jobs = [job(0, slots=pool, min_slots=10), job(1, arrival=T, slots=pool, min_slots=10)]
    result = simulate(jobs, policy="equal", slots_per_switch=pool, cal=cal)
    t_full = 0.05 + 100e6 / (pool * 128 / WINDOW) + 5e-6
    t_half = 0.05 + 100e6 / (pool // 2 * 128 / WINDOW) + 5e-6
    a, b = result.jobs
    done_before = T / t_full
    assert a.finish_s == pytest.approx(T + (100 - done_before) * t_half, rel=1e-9)
    # B shares until A leaves, then has the pool to itself.
    b_done_shared = (a.finish_s - T) / t_half
    assert b.finish_s == pytest.approx(a.finish_s + (100 - b_done_shared) * t_full, rel=1e-9)
    assert [h[2] for h in a.history] == [pool, pool // 2]
    assert a.range_changes == 1


def test_queueing_delay_when_workers_are_busy():
    result = simulate([job(0, workers=8), job(1, arrival=1.0, workers=8)])
    a, b = result.jobs
    assert b.start_s == pytest.approx(a.finish_s) and b.queue_s == pytest.approx(a.finish_s - 1.0)


@pytest.mark.parametrize("split, expected", [("equal", 0.2), ("proportional", 2 / (1 / 0.1 + 1 / 0.2))])
def test_heterogeneous_workers(split, expected):
    """Equal split waits for the slowest worker; proportional split finishes all together: n / sum(1/c_i)."""
    spec = JobSpec(0, 0.0, 2, 0, 10, (0.1, 0.2))  # no gradient bytes: only ring step latencies remain
    cluster = ClusterSpec(racks=1, ina_fraction=0.0)
    sim = Simulation(cluster, CAL, make_policy("equal"), make_placement("pack"), data_split=split)
    (r,) = sim.run([spec]).jobs
    assert r.jct_s == pytest.approx(10 * (expected + 2 * 1 * 10e-6), rel=1e-9)


def test_deadline_missed_is_reported():
    result = simulate([job(0, deadline_s=1.0), job(1, deadline_s=1e6, workers=2)])
    assert [r.deadline_missed for r in result.jobs] == [True, False]


# --- invariants at every event, determinism ---------------------------------------------------------


def small_trace(n=150, seed=3):
    cfg = SyntheticConfig(num_jobs=n, mean_interarrival_s=20.0, iterations_median=300, hetero=0.3)
    return generate_trace(cfg, seed)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_slots_are_never_over_allocated_at_any_event(policy, placement):
    spec = ClusterSpec(racks=6, workers_per_rack=8, slots_per_switch=500, ina_fraction=0.7, uplink_gbps=100)
    seen = {"events": 0, "contended": 0}

    def hook(sim: Simulation, now: float) -> None:
        seen["events"] += 1
        for rack, sw in enumerate(sim.switches):
            ranges = sorted((r.base, r.end) for r in sw.alloc.values() if r is not None)
            assert all(end <= sw.pool for _, end in ranges)
            assert all(a_end <= b_base for (_, a_end), (b_base, _) in itertools.pairwise(ranges))
            assert sum(end - base for base, end in ranges) <= sw.pool
            demands = {d.job_id: d for d in sw.demands}
            assert set(sw.alloc) == set(demands)
            for job_id, r in sw.alloc.items():
                assert r is None or demands[job_id].min_slots <= r.size <= demands[job_id].requested_slots
            if sum(d.requested_slots for d in sw.demands) > sw.pool:
                seen["contended"] += 1
        assert all(f >= 0 for f in sim.view.free_workers)

    sim = Simulation(spec, CAL, make_policy(policy), make_placement(placement), check=True, on_event=hook)
    result = sim.run(small_trace())
    assert seen["events"] == result.events and len(result.jobs) == 150 and result.unfinished == 0
    if placement != "spread":
        assert seen["contended"] > 0  # the trace really fights over memory


def test_deterministic_for_a_seed():
    spec = ClusterSpec(racks=4, workers_per_rack=8, slots_per_switch=512)
    runs = [
        Simulation(spec, CAL, make_policy("weighted"), make_placement("ina-aware")).run(small_trace(seed=s)).jobs
        for s in (5, 5, 6)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_check_mode_catches_a_broken_policy():
    @register_policy
    class Greedy(SizedPolicy):
        name = "test-greedy"

        def sizes(self, pool_size, jobs):
            return {j.job_id: j.requested_slots for j in jobs}  # ignores the pool: a bug

    try:
        with pytest.raises((InvariantError, AssertionError)):
            simulate([job(0, slots=100), job(1, slots=100)], policy="test-greedy", slots_per_switch=150)
    finally:
        del POLICIES["test-greedy"]


def test_a_policy_added_to_the_controller_is_usable_here():
    @register_policy
    class Nothing(SizedPolicy):
        name = "test-nothing"

        def sizes(self, pool_size, jobs):
            return {j.job_id: 0 for j in jobs}

    try:
        (r,) = simulate([job(workers=8)], policy="test-nothing").jobs
        assert r.history[0][1] == "ring"
    finally:
        del POLICIES["test-nothing"]


def test_job_larger_than_the_cluster_is_refused():
    with pytest.raises(ValueError, match="more workers than the cluster"):
        simulate([job(workers=9)])


# --- model ------------------------------------------------------------------------------------------


def test_ina_rate_bounds():
    bw = 100 * GB
    assert model.ina_rate(CAL, bw, 10_000, 4) == pytest.approx(bw * 128 / 184)  # line rate
    assert model.ina_rate(CAL, bw, 10, 4) == pytest.approx(10 * 128 / WINDOW)  # window bound
    slow = dataclasses.replace(CAL, switch_pps=100_000)
    assert model.ina_rate(slow, bw, 10_000, 4) == pytest.approx(100_000 * 128 / 4)  # packet-rate bound
    assert model.saturating_slots(CAL, bw * 128 / 184) == 340


def test_ring_time_and_trivial_cases():
    assert model.ring_time(CAL, 1e6, 1, 1e9) == 0.0
    assert model.ring_time(CAL, 1e6, 4, 1e9) == pytest.approx(1.5 * 1e6 / 1e9 + 6 * 10e-6)
    assert model.rina_time(CAL, 1e6, 1, 1e9) == model.ina_time(CAL, 1e6, 1e9)


def test_min_useful_slots_is_the_break_even_with_ring():
    bw = 100 * GB
    ring = model.ring_time(CAL, 1e8, 8, bw * 0.94)

    def slot_time(s):
        return model.ina_time(CAL, 1e8, model.ina_rate(CAL, bw, s, 8))

    s = model.min_useful_slots(CAL, 340, slot_time, ring)
    assert slot_time(s) <= ring < slot_time(s - 1)
    assert model.min_useful_slots(CAL, 340, slot_time, ring / 10) is None


def test_calibration_table_round_trip_and_errors(tmp_path):
    """The [calibration] table of ina-sim's configuration: read from TOML, printed back, and refused naming the key."""
    path = tmp_path / "sim.toml"
    path.write_text('[calibration]\nina_rtt_us = 40\nswitch_pps = 16000\nsource = "testbed run 1"\n')
    cal = load(SimConfig, path).calibration
    assert cal.ina_rtt_us == 40 and cal.switch_pps == 16000 and cal.frame_bytes == 184
    path.write_text(to_toml(SimConfig(calibration=cal)))
    assert load(SimConfig, path).calibration == cal
    for text, message in [
        ("rtt = 4", "unknown key calibration.rtt"),
        ("ina_rtt_us = -1", "ina_rtt_us"),
        ("frame_bytes = 100", "frame_bytes"),
        ("ring_goodput_fraction = 1.5", "ring_goodput_fraction"),
    ]:
        path.write_text(f"[calibration]\n{text}\n")
        with pytest.raises(ConfigError, match=message):
            load(SimConfig, path)
    with pytest.raises(CalibrationError, match="comm_overlap"):
        Calibration(comm_overlap=1.0)


# --- placement --------------------------------------------------------------------------------------


def view(free, ina=None, free_slots=None, slot_jobs=None):
    n = len(free)
    return RackView(list(free), tuple(ina or [True] * n), list(free_slots or [100] * n), list(slot_jobs or [0] * n))


def test_pack_uses_the_fewest_racks_best_fit():
    assert make_placement("pack").place(3, view([8, 4, 3])) == [(2, 3)]
    assert make_placement("pack").place(10, view([8, 4, 3])) == [(0, 8), (1, 2)]
    assert make_placement("pack").place(16, view([8, 4, 3])) is None


def test_spread_uses_one_worker_per_rack():
    assert make_placement("spread").place(3, view([8, 4, 3, 0])) == [(0, 1), (1, 1), (2, 1)]
    assert make_placement("spread").place(5, view([2, 2, 1])) == [(0, 2), (1, 2), (2, 1)]


def test_ina_aware_prefers_racks_whose_switch_can_aggregate():
    placer = make_placement("ina-aware")
    v = view([8, 8, 6, 5], ina=[False, True, True, True], free_slots=[0, 500, 40, 300], slot_jobs=[0, 0, 1, 1])
    assert placer.place(4, v, slots=200) == [(3, 4)]  # enough free slots, then best fit on workers
    assert placer.place(4, v, slots=400) == [(1, 4)]  # only rack 1 has 400 free slots
    assert placer.place(1, v) == [(0, 1)]  # a job that will not aggregate keeps INA racks free
    assert placer.place(4, v, slots=0) == [(0, 4)]
    v = view([8, 3, 4], ina=[False, True, True], free_slots=[0, 500, 500])
    assert placer.place(7, v, slots=100) == [(2, 4), (1, 3)]  # span INA racks (Rina) rather than one plain rack
    v = view([8, 1, 1], ina=[False, True, True])
    assert placer.place(7, v, slots=100) == [(0, 7)]  # no INA option: pack


def test_simulator_hands_placements_the_slot_hint():
    seen = []

    class Spy(type(make_placement("pack"))):
        def place(self, workers, view, slots=0):
            seen.append((workers, slots))
            return super().place(workers, view, slots)

    sim = Simulation(ClusterSpec(racks=2), CAL, make_policy("equal"), Spy())
    sim.run([job(0, workers=1), job(1, workers=8), job(2, workers=16, arrival=1e4), job(3, workers=8, slots=77)])
    assert seen == [(1, 0), (8, 342), (8, 77), (16, 342)]


def test_propagation_round_trip_lengthens_the_window_and_every_ring_step():
    cal = dataclasses.replace(CAL, propagation_rtt_us=10_000.0)  # the testbed's 10 ms
    host = 2e6 / 8  # 2 Mbit/s
    window = 5e-6 + 0.010 + 2 * 184 / host
    assert model.window_rtt(cal, host) == pytest.approx(window)
    assert model.ina_rate(cal, host, 4, 4) == pytest.approx(4 * 128 / window)  # below the BDP: window-bound
    assert model.ina_rate(cal, host, 64, 4) == pytest.approx(host * 128 / 184)  # above it: line rate
    assert model.saturating_slots(cal, host * 128 / 184, host) == math.ceil(host / 184 * window)  # 16 slots
    assert model.ring_time(cal, 1e6, 4, 1e9) == pytest.approx(1.5 * 1e6 / 1e9 + 6 * (10e-6 + 0.010))
    assert model.ina_time(cal, 1e6, 1e9) == pytest.approx(1e6 / 1e9 + 5e-6 + 0.010)


def test_a_measured_ring_step_overhead_replaces_the_latency_behind_the_bytes():
    """With ring_step_overhead_us (the ring probe's fit) a step costs its chunk's transfer plus that overhead, never
    less than the path's latency (software step latency + propagation); without it the latency adds to every step."""
    host = 0.5e6 / 8  # the trace's 0.5 Mbit/s
    cal = dataclasses.replace(CAL, propagation_rtt_us=40_000.0, ring_step_latency_us=500.0)
    measured = dataclasses.replace(cal, ring_step_overhead_us=2_000.0)
    latency = 500e-6 + 0.040
    big, small = 8192, 512  # chunk bytes: 131 ms of transfer (bytes-bound), 8 ms (latency-bound)
    assert model.ring_step_time(cal, big, host) == pytest.approx(latency + big / host)
    assert model.ring_step_time(measured, big, host) == pytest.approx(0.002 + big / host)
    assert model.ring_step_time(measured, small, host) == pytest.approx(latency)
    assert model.ring_time(measured, 4 * big, 4, host) == pytest.approx(6 * (0.002 + big / host))
    assert model.ring_time(cal, 4 * big, 4, host) == pytest.approx(1.5 * 4 * big / host + 6 * latency)  # as before
    # Rina's ring of racks takes the same steps (2 racks: chunk B/2), then the last INA round trip.
    assert model.rina_time(measured, 2 * big, 2, host) == pytest.approx(2 * (0.002 + big / host) + 5e-6 + 0.040)


def test_a_ring_job_in_the_simulator_takes_the_measured_steps():
    """A 4-worker ring job with no INA: iterations x 2(n-1) measured steps."""
    cal = dataclasses.replace(CAL, propagation_rtt_us=40_000.0, ring_step_overhead_us=1_000.0, ring_goodput_fraction=0.9)
    host = 0.5e6 / 8
    spec = ClusterSpec(racks=1, workers_per_rack=4, host_gbps=0.0005, ina_fraction=0.0)
    result = Simulation(spec, cal, make_policy("first-fit"), make_placement("pack"), check=True).run(
        [job(0, workers=4, nbytes=32768, iterations=3, compute=0.0)])
    assert result.jobs[0].jct_s == pytest.approx(3 * 6 * (0.001 + 8192 / (0.9 * host)), rel=1e-9)


def test_a_move_off_the_ring_loses_the_ring_all_reduce_in_flight():
    """B waits on the ring while A holds the whole pool; when A leaves (mid-way through one of B's ring all-reduces)
    B moves to INA. With ring_move_restarts_op (the testbed's agents abort the ring op in flight) B's progress goes
    back to its last whole all-reduce; without it the fraction done on the ring is kept."""
    host, nbytes, pool = 100 * GB, 1e8, 342
    t_ina = model.ina_time(CAL, nbytes, model.ina_rate(CAL, host, pool, 4))
    t_ring = model.ring_time(CAL, nbytes, 4, host * CAL.ring_goodput_fraction)
    assert t_ina < t_ring  # B takes INA once it has slots
    jobs = [job(0, workers=4, nbytes=nbytes, iterations=7, compute=0.0, slots=pool, min_slots=pool),
            job(1, workers=4, nbytes=nbytes, iterations=20, compute=0.0, slots=pool, min_slots=pool)]
    leave = 7 * t_ina  # A's finish: B's ring progress then
    done = leave / t_ring
    assert done % 1 > 0.1  # mid-way through an all-reduce
    kept = simulate(jobs, slots_per_switch=pool).jobs[1]
    lost = simulate(jobs, slots_per_switch=pool, cal=dataclasses.replace(CAL, ring_move_restarts_op=True)).jobs[1]
    assert [h[1] for h in lost.history] == ["ring", "ina"]
    assert kept.finish_s == pytest.approx(leave + (20 - done) * t_ina, rel=1e-9)
    assert lost.finish_s == pytest.approx(leave + (20 - math.floor(done)) * t_ina, rel=1e-9)


@pytest.mark.parametrize("compute, in_flight", [(0.010, True), (0.020, False)])
def test_a_move_during_an_iterations_compute_loses_no_ring_work(compute, in_flight):
    """With compute c before each all-reduce, B's ring op begins c into its iteration: a move after that loses the
    op's work since then; a move during the compute loses nothing."""
    host, nbytes, pool = 100 * GB, 1e8, 342
    t_ina = model.ina_time(CAL, nbytes, model.ina_rate(CAL, host, pool, 4))
    t_ring = model.ring_time(CAL, nbytes, 4, host * CAL.ring_goodput_fraction)
    jobs = [job(0, workers=4, nbytes=nbytes, iterations=7, compute=0.010, slots=pool, min_slots=pool),
            job(1, workers=4, nbytes=nbytes, iterations=20, compute=compute, slots=pool, min_slots=pool)]
    leave = 7 * (0.010 + t_ina)
    done = leave / (compute + t_ring)
    head = compute / (compute + t_ring)  # where in its iteration B's ring op begins
    assert (done % 1 > head) == in_flight
    restart = dataclasses.replace(CAL, ring_move_restarts_op=True)
    b = simulate(jobs, slots_per_switch=pool, cal=restart).jobs[1]
    kept = math.floor(done) + head if in_flight else done
    assert b.finish_s == pytest.approx(leave + (20 - kept) * (compute + t_ina), rel=1e-9)


def test_a_negative_ring_step_overhead_is_refused():
    with pytest.raises(CalibrationError, match="ring_step_overhead_us"):
        dataclasses.replace(CAL, ring_step_overhead_us=-1.0)


def test_a_reallocation_pause_stops_a_moved_job_once_per_move():
    """As test_slot_loss_mid_run_is_charged_from_that_moment, with a pause P: A is moved once (at T), so it
    finishes P later; B is moved once too (when A leaves), one more P."""
    pause = 0.25
    cal = dataclasses.replace(CAL, ring_goodput_fraction=0.05)
    paused = dataclasses.replace(cal, realloc_pause_us=pause * 1e6)
    pool, T = 200, 3.0
    jobs = [job(0, slots=pool, min_slots=10), job(1, arrival=T, slots=pool, min_slots=10)]
    base = simulate(jobs, policy="equal", slots_per_switch=pool, cal=cal).jobs
    a, b = simulate(jobs, policy="equal", slots_per_switch=pool, cal=paused).jobs
    assert a.range_changes == 1 and a.finish_s == pytest.approx(base[0].finish_s + pause, rel=1e-9)
    assert b.finish_s > base[1].finish_s + pause * 0.5
