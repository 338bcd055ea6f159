"""Experiment 3's testbed-vs-simulator step: the measured all-reduce time, the probes, the simulated trace."""
from __future__ import annotations

import csv
import dataclasses

import pytest

from simulator import model, shared_switch
from simulator.calibration import Calibration
from topologies.experiments import calibrate
from topologies.experiments.calibrate import (
    RING_PROBE,
    LabCalibration,
    calibration_from,
    overlapping_calls,
    ring_step_fit,
    run_startup_probe,
)
from topologies.experiments.conditions import Conditions, busy_jiffies
from topologies.experiments.multijob import PHASES, TRACE, _joined, _steady, job_phases, move_pauses, simulate_trace


def test_busy_time_counts_the_first_call_from_the_last_worker_to_join():
    """Worker 0 started 1 s before the others: its first call waited for them; the job's all-reduce time counts
    the first call as the shortest worker's."""
    workers = [{"seconds": [1.5, 0.5, 0.5]}, {"seconds": [0.55, 0.5, 0.5]}, {"seconds": [0.6, 0.5, 0.5]}]
    calls = [1.5, 0.5, 0.5]  # per_call_max
    out = _joined(workers, calls, exited=10.0)
    assert out["busy_joined_s"] == pytest.approx(1.55)
    assert out["joined_s"] == pytest.approx(10.0 - 1.55)
    assert _joined([], [], 1.0) == {"busy_joined_s": None, "joined_s": None}


def test_steady_time_leaves_out_the_warm_up_call():
    assert _steady([1.5, 0.5, 0.25], exited=10.0) == {"busy_steady_s": 0.75, "steady_from_s": 9.25}
    assert _steady([1.5], exited=10.0) == {"busy_steady_s": None, "steady_from_s": None}


def test_the_trace_probes_give_the_window_round_trip_and_the_shared_ceiling():
    probes = [
        {"probe": "ina-1slot", "bytes": 65536, "seconds_median": 512 * 300e-6},
        {"probe": "ina-window", "slots": 8, "bytes": 65536, "seconds_median": (512 / 8 + 1) * (0.0215 + 2 * 1.472e-3),
         "bw_mbps": 1.0},
        {"probe": "ina-shared-pps", "gradients_per_s": 9000.0},
    ]
    cal = calibration_from(probes, ring_goodput=None, source="t", rtt_ms=20.0).model
    assert cal.ina_rtt_us == pytest.approx(1500.0)  # 21.5 ms + 2 frames at 1 Mbit/s, less the 20 ms added and the frames
    assert cal.switch_shared_pps == 9000.0 and cal.propagation_rtt_us == 20000.0
    alone = calibration_from(probes[:1], ring_goodput=None, source="t", rtt_ms=20.0).model
    assert alone.ina_rtt_us == pytest.approx(300.0) and alone.switch_shared_pps is None


def test_the_shared_ceiling_is_the_model_inverted_on_the_probe_links():
    """A probe row with its configuration (4 jobs of 4 workers, 64 slots, 4 Mbit/s shaped, 20 ms): the capacity
    with which ina-sim gives the measured rate for those jobs, with the window probe's round trip."""
    window = {"probe": "ina-window", "slots": 8, "bytes": 65536, "seconds_median": (512 / 8 + 1) * (0.0215 + 2 * 1.472e-3),
              "bw_mbps": 1.0}
    shared = {"probe": "ina-shared-pps", "gradients_per_s": 6000.0, "slots": 64, "job_workers": [4, 4, 4, 4],
              "bw_mbps": 4.0, "rtt_ms": 20.0}
    cal = calibration_from([window, shared], ring_goodput=None, source="t", rtt_ms=20.0).model
    assert cal.switch_shared_pps > 6000.0  # the windows back off before the server is full
    probe = dataclasses.replace(cal, propagation_rtt_us=20000.0)
    assert shared_switch.shared_throughput(probe, 4e6 / 8, [(64, 4)] * 4) == pytest.approx(6000.0, rel=1e-6)
    startup = {"probe": "agent-startup-cpu", "cpu_s_median": 0.6, "cores": 2}
    with_startup = calibration_from([window, shared, startup], ring_goodput=None, source="t", rtt_ms=20.0)
    assert (with_startup.agent_startup_cpu_s, with_startup.shared_cores) == (0.6, 2.0)
    assert with_startup.model.switch_shared_pps == pytest.approx(cal.switch_shared_pps)  # the probe's calls: agents running
    line = {**shared, "gradients_per_s": 16 * 4e6 / 8 / 184}  # the links' rate: no ceiling measured
    assert calibration_from([window, line], ring_goodput=None, source="t", rtt_ms=20.0).model.switch_shared_pps is None


def test_the_shared_ceiling_comes_from_the_probe_cpu_accounting():
    """A probe row with its conditions: 1.2 cores of agents and switch for 4,000 gradients/s (300 us each) on 2
    cores, of which the controller, runner and interrupts took 0.15 and other work and steal 0.25: the 1.6 cores
    left carry 1.6 / 300 us = 5,333 gradients/s, whatever rate the probe's links or that background allowed; the
    median over the repetitions; a row without accounting falls back to the model inverted."""
    def shared(rate, agents, others):
        return {"probe": "ina-shared-pps", "gradients_per_s": rate, "slots": 16, "job_workers": [4, 4, 4, 4],
                "bw_mbps": 0.5, "rtt_ms": 40.0,
                "conditions": {"cores": 2, "agents_cores": agents, "switch_cores": 0.2, "controller_cores": 0.05,
                               "runner_cores": 0.06, "irq_cores": 0.04, "others_cores": others, "steal_cores": 0.0}}

    one = shared(4000.0, 1.0, 0.25)
    assert calibrate.shared_cpu_per_gradient(one) == pytest.approx(300e-6)
    assert calibrate.shared_capacity_from_cpu(one) == pytest.approx(1.6 / 300e-6)
    rows = [one, shared(5000.0, 1.3, 0.0), shared(3000.0, 0.7, 0.75)]  # 300 us, 300 us, 300 us per gradient
    cal = calibration_from(rows, ring_goodput=None, source="t", rtt_ms=40.0).model
    assert cal.switch_shared_pps == pytest.approx(1.6 / 300e-6)  # the median of 1.6, 1.85 and 1.1 cores left
    assert calibrate.shared_capacity_from_cpu({**one, "conditions": {}}) is None
    busy = {**one, "conditions": {**one["conditions"], "others_cores": 2.0}}
    assert calibrate.shared_capacity_from_cpu(busy) is None  # no cores left: nothing measured


def test_repeated_trace_probes_give_their_medians():
    """multijob takes the window and shared probes before each repetition: the calibration is their medians (an
    outlier set, taken at a quiet moment, moves nothing)."""
    def window(seconds):
        return {"probe": "ina-window", "slots": 8, "bytes": 65536, "seconds_median": seconds, "bw_mbps": 1.0}

    def shared(rate):
        return {"probe": "ina-shared-pps", "gradients_per_s": rate, "slots": 64, "job_workers": [4, 4, 4, 4],
                "bw_mbps": 4.0, "rtt_ms": 20.0}

    rows = [window(65 * 0.0245), shared(5000.0), window(65 * 0.0260), shared(4500.0), window(65 * 0.0231), shared(11000.0)]
    cal = calibration_from(rows, ring_goodput=None, source="t", rtt_ms=20.0).model
    middle = calibration_from(rows[:2], ring_goodput=None, source="t", rtt_ms=20.0).model  # the median window, 5000/s
    assert cal.ina_rtt_us == pytest.approx(24.5e3 - 20e3 - 2 * 1472.0, rel=1e-6)
    mids = sorted(calibration_from([rows[0], r], ring_goodput=None, source="t", rtt_ms=20.0).model.switch_shared_pps
                  for r in rows[1::2])
    assert cal.switch_shared_pps == pytest.approx(mids[1])
    assert cal.switch_shared_pps == pytest.approx(middle.switch_shared_pps)


@pytest.mark.local
def test_the_startup_probe_measures_an_agent_import():
    rows = []
    row = run_startup_probe(repeats=1, record=rows.append, progress=lambda _: None)
    assert rows == [row] and row["cores"] >= 1 and len(row["cpu_s"]) == 1 and row["cpu_s_median"] > 0


def test_simulated_trace_starts_each_job_after_its_start_up(tmp_path):
    cal = Calibration(propagation_rtt_us=20000.0, ina_rtt_us=300.0)
    startup = {1: 2.0, 2: 1.0, 3: 3.0, 4: 2.5}
    kw = {"requested": 16, "min_slots": 1, "pool": 64, "policy": "first-fit", "bw_mbps": 1.0, "calibration": cal}
    late = simulate_trace(TRACE, out=tmp_path / "late", startup=startup, **kw)
    now = simulate_trace(TRACE, out=tmp_path / "now", **kw)
    for tj in TRACE:
        assert late[tj.job]["busy_s"] == pytest.approx(now[tj.job]["busy_s"], rel=1e-6)  # no shared bound: alone
        assert late[tj.job]["jct_s"] == pytest.approx(now[tj.job]["jct_s"] + startup[tj.job], rel=1e-6)
    with (tmp_path / "late" / "trace.csv").open() as fh:
        assert [float(r["startup_s"]) for r in csv.DictReader(fh)] == [2.0, 1.0, 3.0, 2.5]
    steady = simulate_trace(TRACE, out=tmp_path / "steady", skip_first=True, **kw)
    for tj in TRACE:  # one all-reduce fewer, each as long as before
        assert steady[tj.job]["busy_s"] == pytest.approx(now[tj.job]["busy_s"] * (tj.iterations - 1) / tj.iterations, rel=1e-6)
    shared = dataclasses.replace(cal, switch_shared_pps=5000.0)
    slow = simulate_trace(TRACE, out=tmp_path / "slow", startup=startup, **{**kw, "calibration": shared})
    assert all(slow[tj.job]["busy_s"] > now[tj.job]["busy_s"] for tj in TRACE)


def test_the_shared_probe_counts_the_calls_run_while_every_job_ran():
    """Job A's calls end at 10 s (exit), job B's at 11 s: A runs [4, 10], B [6, 11]; the window where both ran is
    [6, 10]: A's calls from 6 s on, B's calls up to 10 s."""
    a = [1.0, 1.0, 2.0, 2.0]  # [4, 5], [5, 6], [6, 8], [8, 10]
    b = [2.0, 2.0, 1.0]  # [6, 8], [8, 10], [10, 11]
    assert overlapping_calls([a, b], [10.0, 11.0]) == [[2.0, 2.0], [2.0, 2.0]]
    assert overlapping_calls([a, []], [10.0, 11.0]) == [[], []]


def test_machine_cpu_is_read_from_proc_stat():
    text = "cpu  100 20 30 400 50 5 15 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert busy_jiffies(text) == (100 + 20 + 30 + 5 + 15 + 10, 630, 20, 10)  # busy: not idle 400, not iowait 50
    with pytest.raises(ValueError):
        busy_jiffies("intr 1 2 3\n")


def test_conditions_name_the_measurement_and_its_cpu():
    with Conditions(bw_mbps=1.0, window_slots=16, jobs=4) as cond:
        sum(range(10_000))
    out = cond.result
    assert (out["bw_mbps"], out["window_slots"], out["jobs"]) == (1.0, 16, 4)
    assert out["wall_s"] > 0 and out["cores"] >= 1 and out["busy_cores"] >= 0 and out["others_cores"] >= 0
    assert {"switch_cores", "controller_cores", "agents_cores", "runner_cores", "irq_cores", "steal_cores", "loadavg_start"} <= set(out)


def test_the_lab_hands_ina_sim_an_agents_start_up_as_a_share_of_the_switch(tmp_path):
    """The testbed's agents start on the cores the switch runs on: c CPU-seconds on k cores is, for ina-sim, c / k of
    the switch's capacity C for the start-up, worker_startup_packets = c C / k; written as ina-sim's [calibration]."""
    lab = LabCalibration(model=Calibration(switch_shared_pps=8000.0), agent_startup_cpu_s=0.6, shared_cores=2.0)
    assert lab.simulator().worker_startup_packets == pytest.approx(0.6 * 8000.0 / 2.0)
    assert shared_switch.startup_load(lab.simulator(), 4, 2.0) == pytest.approx(4 * 0.6 / (2.0 * 2.0))
    assert LabCalibration(model=Calibration(), agent_startup_cpu_s=0.6, shared_cores=2.0).simulator() == Calibration()
    path = calibrate.write_calibration(lab, tmp_path / "calibration.toml")
    assert calibrate.read_calibration(path) == lab.simulator()
    assert "0.6 CPU-s on 2 shared cores" in path.read_text()


def test_an_agents_measured_life_replaces_its_import_as_start_up_cpu():
    """The lifecycle probe (start, register, grant, one tiny all-reduce, exit) measures what the import-only probe
    bounds from below; repeated, the calibration takes its median."""
    startup = {"probe": "agent-startup-cpu", "cpu_s_median": 0.5, "cores": 2}
    lives = [{"probe": "agent-lifecycle-cpu", "cpu_s_per_agent": v, "cores": 2} for v in (0.7, 0.6, 0.9)]
    assert calibration_from([startup], ring_goodput=None, source="t").agent_startup_cpu_s == 0.5
    lab = calibration_from([startup, *lives], ring_goodput=None, source="t")
    assert (lab.agent_startup_cpu_s, lab.shared_cores) == (0.7, 2.0)


def test_window_probes_that_resolve_no_round_trip_count_in_the_median():
    """Three window probes: one above the added round trip and serialization (1 ms more), two below (htb's burst):
    their median resolves nothing, so the unshaped one-slot probe's round trip stands."""
    def window(w_ms):
        return {"probe": "ina-window", "slots": 12, "bytes": 65536, "seconds_median": (512 / 12 + 1) * w_ms / 1000,
                "bw_mbps": 1.0}

    one = {"probe": "ina-1slot", "bytes": 65536, "seconds_median": 512 * 300e-6}
    frames = 2 * 184 * 8 / 1e6 * 1e3  # ms
    low = calibration_from([one, window(20 + frames + 1.0), window(22.4), window(22.0)], ring_goodput=None, source="t", rtt_ms=20.0).model
    assert low.ina_rtt_us == pytest.approx(300.0)
    high = calibration_from([one, window(20 + frames + 1.0), window(20 + frames + 2.0), window(22.0)], ring_goodput=None,
                            source="t", rtt_ms=20.0).model
    assert high.ina_rtt_us == pytest.approx(1000.0, rel=1e-6)


def test_the_comparison_per_repetition_and_by_other_work_on_the_machine():
    """Two repetitions of one run against one prediction of 10 s: the first on a quiet machine (job exact), the
    second with other work taking 0.5 cores (job 30 % slower)."""
    from topologies.experiments.multijob import QUIET_CORES, _per_repetition

    sims = [{"supply": 1.0, "policy": "equal", "job": 1, "sim_s": 10.0}]
    rows = [{"kind": "job", "supply": 1.0, "policy": "equal", "job": 1, "rep": 1, "busy_steady_s": 10.0},
            {"kind": "job", "supply": 1.0, "policy": "equal", "job": 1, "rep": 2, "busy_steady_s": 13.0},
            {"kind": "memory", "supply": 1.0, "policy": "equal", "rep": 1, "conditions": {"others_cores": 0.0}},
            {"kind": "memory", "supply": 1.0, "policy": "equal", "rep": 2, "conditions": {"others_cores": 0.5}}]
    out = _per_repetition(rows, sims)
    assert [(r["rep"], r["within_tolerance"], r["others_cores_median"]) for r in out["per_repetition"]] == [(1, 1, 0.0), (2, 0, 0.5)]
    assert out["per_repetition"][1]["median_abs_rel_diff"] == pytest.approx(0.3)
    assert out["by_background"]["quiet_cores"] == QUIET_CORES
    assert (out["by_background"]["quiet"]["within_tolerance"], out["by_background"]["loaded"]["jobs"]) == (1, 1)


def test_the_trace_keeps_its_bdp_in_slots_at_its_scale():
    """The trace runs on 0.5 Mbit/s links with a 40 ms round trip (CPU-bound at 1 Mbit/s,
    docs/experiments.md): a job's BDP stays 15.6 slots and its request 16; the CI preset keeps its own scale."""
    from topologies.experiments.aggregate import bdp_slots
    from topologies.experiments.multijob import MultijobConfig, MultijobExperiment

    for preset in ("small", "full"):
        cfg = MultijobExperiment.presets()[preset]
        assert (cfg.bw_mbps, cfg.rtt_ms, cfg.demand_slots) == (0.5, 40.0, 16)
        assert bdp_slots(cfg.rtt_ms, cfg.bw_mbps) == pytest.approx(bdp_slots(20.0, 1.0)) == pytest.approx(15.6, abs=0.05)
    tiny = MultijobExperiment.presets()["tiny"]
    assert (tiny.bw_mbps, tiny.rtt_ms, tiny.demand_slots) == (2.0, 4.0, 8)
    assert MultijobConfig().bw_mbps == 0.5


def _ring_row(elements: int, seconds: float, workers: int = 4, bw_mbps: float | None = 0.5) -> dict:
    return {"kind": "probe", "probe": RING_PROBE, "workers": workers, "backend": "ring", "elements": elements,
            "bytes": 4 * elements, "seconds_median": seconds, "bw_mbps": bw_mbps, "rtt_ms": 40.0}


def test_the_ring_probe_fits_a_step_overhead_and_a_per_byte_cost():
    """Two sizes on a line: per step (time / 2(n-1)) = overhead + chunk (bytes / n) x cost, recovered exactly; the
    calibration carries the overhead and the cost as a share of the link (0.5 Mbit/s)."""
    overhead, cost = 0.004, 1 / (0.8 * 62_500)  # 4 ms per step, 80 % of the link
    rows = [_ring_row(e, 6 * (overhead + e * 4 / 4 * cost)) for e in (8192, 16384)]
    assert ring_step_fit(rows) == pytest.approx((overhead, cost))
    cal = calibration_from(rows, ring_goodput=0.94, source="t", rtt_ms=40.0).model
    assert cal.ring_step_overhead_us == pytest.approx(4000.0)
    assert cal.ring_goodput_fraction == pytest.approx(0.8)
    assert not cal.ring_move_restarts_op  # the testbed's agents let the ring op in flight finish on a move to INA
    # The simulator then predicts the probe's own calls.
    assert model.ring_time(cal, 4 * 8192, 4, 62_500 * cal.ring_goodput_fraction) == pytest.approx(rows[0]["seconds_median"])


def test_a_ring_step_that_hides_its_latency_fits_through_the_origin():
    """The trace's scale: 32 and 64 KiB rings in 0.856 and 1.731 s on 0.5 Mbit/s with 40 ms, a negative intercept
    (the path's latency hidden behind the bytes): the overhead is 0 and the cost is the least-squares slope
    through the origin; repeated probes count by their median per size; one size alone fits nothing."""
    rows = [_ring_row(8192, 0.856), _ring_row(16384, 1.731), _ring_row(16384, 1.9), _ring_row(16384, 1.70)]
    overhead, cost = ring_step_fit(rows)
    xs, ys = (8192.0, 16384.0), (0.856 / 6, 1.731 / 6)
    assert overhead == 0.0
    assert cost == pytest.approx(sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    assert ring_step_fit(rows[1:]) is None
    assert calibration_from(rows[1:], ring_goodput=None, source="t").model.ring_step_overhead_us is None
    unshaped = [_ring_row(8192, 0.2, bw_mbps=None), _ring_row(16384, 0.3, bw_mbps=None)]
    assert calibration_from(unshaped, ring_goodput=None, source="t").model.ring_step_overhead_us is None  # no link rate


def test_the_ring_probe_spans_the_traces_sizes():
    from topologies.experiments.multijob import TINY_TRACE, ring_probe_sizes

    assert ring_probe_sizes(TRACE) == (8192, 16384)
    assert ring_probe_sizes(TINY_TRACE) == (2048, 4096)


def test_the_summary_carries_the_ring_probe_and_its_fit():
    from topologies.experiments.multijob import MultijobConfig, MultijobExperiment

    rows = [_ring_row(8192, 6 * 0.14), _ring_row(16384, 6 * 0.28), _ring_row(16384, 6 * 0.30)]
    summary = MultijobExperiment.summarize([{**r, "kind": "probe"} for r in rows], MultijobConfig())
    ring = summary["ring_steps"]
    assert ring["call_s"] == {8192: pytest.approx(0.84), 16384: pytest.approx(1.74)} and ring["workers"] == 4
    overhead, cost = ring_step_fit(rows)
    assert ring["overhead_us"] == pytest.approx(overhead * 1e6)
    assert ring["goodput_fraction"] == pytest.approx(1 / (cost * 62_500))
    assert any(line.startswith("ring probe (4 workers): 32 KiB 0.840 s, 64 KiB 1.740 s")
               for line in MultijobExperiment.report(summary))
    assert MultijobExperiment.summarize([], MultijobConfig())["ring_steps"] == {}


def test_a_jobs_phases_end_at_its_slowest_workers_marks_and_sum_to_its_completion_time():
    def worker(main: float, opened: float, last: float, closed: float, exited: float) -> dict:
        return {"runner": {"launched_s": 3.05, "exited_s": exited,
                           "timeline_s": {"process": 2.0, "main": main, "opened": opened, "first_call": opened,
                                          "first_call_end": opened + 1, "last_call": last, "closed": closed}}}

    workers = [worker(3.1, 3.5, 8.0, 8.1, 8.2), worker(3.3, 3.4, 8.4, 8.45, 8.9)]
    phases = job_phases(workers, arrival_s=3.0)
    assert list(phases) == list(PHASES)
    assert phases == {"launch": 0.05, "imports": 0.25, "join": 0.2, "calls": 4.9, "close": 0.05, "exit": 0.45}
    assert sum(phases.values()) == pytest.approx(8.9 - 3.0)
    del workers[1]["runner"]["timeline_s"]
    assert job_phases(workers, arrival_s=3.0) is None


def test_a_moves_pause_is_its_slowest_workers_until_back_where_it_stopped():
    """Records are joined on the move's generation: a move some worker did not record (a newer grant came first)
    is left out without shifting the others, and a move onto the ring (its replay is ring time) is left out."""
    rows = [{"pauses": [[[0.004, 0.037, 0.037, 0, 0.0, 3, "ina"], [0.0, 0.087, 0.09, 0, 1.2, 5, "ina"]],
                        [[0.001, 0.030, 0.041, 0, 0.0, 3, "ina"], [0.0, 0.2, 0.5, 0, 0.0, 4, "ina"],
                         [0.0, 0.080, 0.102, 0, 1.1, 5, "ina"]]]},
            {"pauses": [[], []]},  # a job that never moved
            {"pauses": [[[0.0, 0.01, 0.02, 0, 0.0, 2, "ina"]], []]},  # a move not every worker recorded
            {"pauses": [[[0.0, 0.01, 0.9, 40, 0.0, 2, "ring"]], [[0.0, 0.01, 0.8, 40, 0.0, 2, "ring"]]]},  # onto the ring
            {}]
    assert move_pauses(rows) == pytest.approx([0.040, 0.102])


def test_the_targets_come_per_repetition_and_the_speed_up_needs_no_unlimited_run():
    from topologies.experiments.multijob import MultijobConfig, MultijobExperiment

    def job(supply: float, policy: str, rep: int, number: int, jct: float) -> dict:
        return {"kind": "job", "supply": supply, "pool": int(64 * supply), "policy": policy, "rep": rep, "job": number,
                "priority": 1 if number > 2 else 0, "jct_s": jct, "busy_s": jct - 1}

    rows = []
    for rep, scale in ((1, 1.0), (2, 2.0)):
        for number in range(1, 5):
            rows.append(job(1.0, "first-fit", rep, number, 10 * scale))
            rows.append(job(0.5, "priority", rep, number, (5 if number > 2 else 15) * scale))
            rows.append(job(0.5, "static", rep, number, (8 if number > 2 else 16) * scale))
    config = MultijobConfig(supply=(1.0, 0.5), policies=("priority", "static"))
    targets = MultijobExperiment.summarize(rows, config)["targets"]
    assert targets["best_policy"] == "priority" and targets["best_vs_unlimited"] == pytest.approx(1.0)
    assert targets["static_vs_unlimited"] == pytest.approx(1.2)
    assert targets["priority_high_speedup_over_static"] == pytest.approx(1.6)
    assert [t["rep"] for t in targets["per_repetition"]] == [1, 2]
    assert all(t["priority_high_speedup_over_static"] == pytest.approx(1.6) for t in targets["per_repetition"])
    half_only = MultijobExperiment.summarize([r for r in rows if r["supply"] == 0.5], config)["targets"]
    assert half_only["priority_high_speedup_over_static"] == pytest.approx(1.6) and "best_policy" not in half_only
