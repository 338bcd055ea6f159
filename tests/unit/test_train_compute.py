"""Training's compute and records: the emulated accelerator, speed schedules, digits, per-step records,
time to target, and the training loop over an in-process reducer of several workers (threads)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from host_agent.compute import EmulatedAccelerator, ScaledAccelerator, SpeedSchedule
from host_agent.metrics import EvalPoint, time_to_target
from host_agent.models import HELD_OUT, digits_split
from host_agent.train import TrainConfig, train


class FakeClock:
    """A clock that only ``sleep`` moves (and ``work`` adds real compute time)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        self.slept.append(dt)
        self.now += dt


def test_speed_schedule_steps_and_parses() -> None:
    s = SpeedSchedule.parse("1,30:0.333,60:1")
    assert [s.at(t) for t in (0, 29, 30, 59, 60, 99)] == [1.0, 1.0, 0.333, 0.333, 1.0, 1.0]
    assert str(s) == "1,30:0.333,60:1" and SpeedSchedule.parse("0.5").at(7) == 0.5
    for bad in ("", "x", "1,3", "1,3:0", "1,5:1,4:1", "-1"):
        with pytest.raises(ValueError):
            SpeedSchedule.parse(bad)


def test_emulated_compute_time_is_batch_times_cost_over_speed() -> None:
    clock = FakeClock()
    acc = EmulatedAccelerator(0.001, SpeedSchedule(1.0, ((2, 0.25),)), clock=clock, sleep=clock.sleep)
    out, t = acc.run(lambda: "grad", 100, 0)
    assert out == "grad" and t == pytest.approx(0.1)
    _, t = acc.run(lambda: None, 50, 1)
    assert t == pytest.approx(0.05)
    _, t = acc.run(lambda: None, 50, 2)  # a quarter of the speed from step 2
    assert t == pytest.approx(0.2)
    assert acc.overruns == 0


def test_emulated_time_holds_when_the_real_work_takes_part_of_it_and_counts_overruns() -> None:
    clock = FakeClock()
    acc = EmulatedAccelerator(0.001, clock=clock, sleep=clock.sleep)

    def work(seconds: float):
        def fn():
            clock.now += seconds
        return fn

    _, t = acc.run(work(0.03), 100, 0)  # 30 ms of real work inside 100 ms of emulated compute
    assert t == pytest.approx(0.1) and clock.slept == [pytest.approx(0.07)]
    _, t = acc.run(work(0.5), 100, 1)  # the real work is longer: it stands, and is counted
    assert t == pytest.approx(0.5) and acc.overruns == 1


def test_a_late_wake_up_is_the_hosts_not_the_devices() -> None:
    """A busy host wakes the sleeper late: the step's wall time grows, its reported compute time does not."""
    clock = FakeClock()

    def late_sleep(dt: float) -> None:
        clock.sleep(dt + 0.02)  # 20 ms of scheduling delay on every wake-up

    acc = EmulatedAccelerator(0.001, clock=clock, sleep=late_sleep)
    _, t = acc.run(lambda: None, 50, 0)
    assert t == pytest.approx(0.05) and clock.now == pytest.approx(0.07) and acc.overruns == 0


def test_jitter_is_seeded_and_bounded() -> None:
    a = EmulatedAccelerator(0.001, jitter=0.2, seed=3)
    b = EmulatedAccelerator(0.001, jitter=0.2, seed=3)
    ta = [a.seconds(100, s) for s in range(50)]
    assert ta == [b.seconds(100, s) for s in range(50)]
    assert len(set(ta)) > 1 and all(0.05 - 1e-12 <= t <= 0.15 + 1e-12 for t in ta)
    with pytest.raises(ValueError):
        EmulatedAccelerator(0.0)


def test_scaled_accelerator_multiplies_measured_time() -> None:
    clock = FakeClock()
    acc = ScaledAccelerator(SpeedSchedule(0.25), clock=clock, cpu_clock=clock, sleep=clock.sleep)

    def fn():
        clock.now += 0.01

    _, t = acc.run(fn, 10, 0)
    assert t == pytest.approx(0.04)  # 4x slower than the host
    assert clock.now == pytest.approx(0.04)


def test_scaled_accelerator_scales_cpu_time_not_wall_time() -> None:
    """Under contention the wall time of the work (30 ms) exceeds its CPU time (10 ms): the device time
    is CPU time / speed, reached by sleeping from the step's start, and that is what is reported."""
    clock, cpu = FakeClock(), FakeClock()
    slow = ScaledAccelerator(SpeedSchedule(0.25), clock=clock, cpu_clock=cpu, sleep=clock.sleep)

    def fn():
        clock.now += 0.03
        cpu.now += 0.01

    _, t = slow.run(fn, 10, 0)
    assert t == pytest.approx(0.04) and clock.now == pytest.approx(0.04) and clock.slept == [pytest.approx(0.01)]
    fast = ScaledAccelerator(SpeedSchedule(1.0), clock=clock, cpu_clock=cpu, sleep=clock.sleep)
    start = clock.now
    _, t = fast.run(fn, 10, 0)
    assert t == pytest.approx(0.01) and clock.now - start == pytest.approx(0.03) and fast.overruns == 0
    half = ScaledAccelerator(SpeedSchedule(0.5), clock=clock, cpu_clock=cpu, sleep=clock.sleep)
    _, t = half.run(lambda: (fn(), fn()), 10, 0)  # 60 ms of wall for a 40 ms device: an overrun, no sleep
    assert t == pytest.approx(0.04) and half.overruns == 1


def test_device_slowdown_makes_every_worker_sleep_to_its_device_time() -> None:
    """With the speed-1 device 10x slower than a host core, a fast worker whose 10 ms of CPU took 30 ms of
    wall (contention) still lasts its device time, 100 ms: contention below 10x no longer sets the pace."""
    clock, cpu = FakeClock(), FakeClock()

    def fn():
        clock.now += 0.03
        cpu.now += 0.01

    fast = ScaledAccelerator(SpeedSchedule(1.0), 10.0, clock=clock, cpu_clock=cpu, sleep=clock.sleep)
    _, t = fast.run(fn, 10, 0)
    assert t == pytest.approx(0.1) and clock.now == pytest.approx(0.1) and fast.overruns == 0
    slow = ScaledAccelerator(SpeedSchedule(1 / 3), 10.0, clock=clock, cpu_clock=cpu, sleep=clock.sleep)
    start = clock.now
    _, t = slow.run(fn, 10, 0)
    assert t == pytest.approx(0.3) and clock.now - start == pytest.approx(0.3)
    tight = ScaledAccelerator(SpeedSchedule(1.0), 2.0, clock=clock, cpu_clock=cpu, sleep=clock.sleep)
    _, t = tight.run(fn, 10, 0)  # 30 ms of wall for a 20 ms device: an overrun, counted at speed 1 too
    assert t == pytest.approx(0.02) and tight.overruns == 1
    for bad in (0.5, float("inf")):
        with pytest.raises(ValueError, match="slowdown"):
            ScaledAccelerator(SpeedSchedule(1.0), bad)
    with pytest.raises(ValueError, match="slowdown"):
        TrainConfig(compute="torch", device_slowdown=0.5)
    assert TrainConfig(compute="torch", device_slowdown=10).accelerator(0).slowdown == 10


def test_digits_split_is_fixed_and_disjoint() -> None:
    d = digits_split()
    assert d.X_test.shape == (HELD_OUT, 64) and d.X_train.shape == (1797 - HELD_OUT, 64)
    assert d.classes == 10 and 0.0 <= d.X_train.min() and d.X_train.max() <= 1.0
    assert np.array_equal(d.X_test, digits_split().X_test)


def test_time_to_target_is_the_first_evaluation_reaching_it() -> None:
    evals = [EvalPoint(1, 20, 0.5, 2.0, 0.4), EvalPoint(3, 40, 1.0, 1.0, 0.91), EvalPoint(5, 60, 1.5, 0.5, 0.95)]
    assert time_to_target(evals, 0.9) == 1.0
    assert time_to_target([e.__dict__ for e in evals], 0.95) == 1.5
    assert time_to_target(evals, 0.99) is None


class ThreadReducer:
    """n workers as threads: allreduce sums float32 arrays (in rank order) at a barrier."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n)
        self.slots: list = [None] * n

    def member(self, rank: int) -> Member:
        return Member(self, rank)


class Member:
    def __init__(self, group: ThreadReducer, rank: int) -> None:
        self.group, self.rank, self.size = group, rank, group.n

    def _exchange(self, x):
        self.group.slots[self.rank] = np.asarray(x).copy()
        self.group.barrier.wait()
        out = np.stack(self.group.slots)
        self.group.barrier.wait()
        return out

    def allreduce(self, x):
        return np.sum(self._exchange(np.asarray(x, dtype=np.float32)), axis=0, dtype=np.float32)

    def allgather(self, x):
        return self._exchange(x)


def run_threads(speeds, **cfg):
    n = len(speeds)
    group = ThreadReducer(n)
    results = [None] * n

    def work(rank):
        results[rank] = train(group.member(rank), TrainConfig(speed=SpeedSchedule.parse(speeds[rank]), **cfg))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.local
def test_training_records_steps_and_evaluations_and_learns() -> None:
    res = run_threads(["1", "1"], allocation="equal", steps=12, global_batch=120, per_sample_s=1e-5, eval_every=4,
                      target_accuracy=0.5)
    r0, r1 = res
    assert r0.final_params_digest == r1.final_params_digest
    for r in res:
        assert len(r.step_wall_s) == len(r.step_compute_s) == len(r.step_comm_s) == len(r.step_end_s) == 12
        assert all(len(t) == 2 for t in r.step_compute_all_s)
    assert [e.step for e in r0.evals] == [3, 7, 11] and [e.samples for e in r0.evals] == [480, 960, 1440]
    assert r0.evals[-1].accuracy > r0.evals[0].accuracy and r0.accuracy == r0.evals[-1].accuracy
    assert r1.evals == [] and r1.accuracy == pytest.approx(r0.accuracy)  # rank 0 evaluates the curve
    assert r0.time_to_target_s == time_to_target(r0.evals, 0.5)
    # every worker knows every worker's compute time of each step: its own is in its slot
    assert r0.step_compute_all_s[5][1] == pytest.approx(r1.step_compute_s[5], abs=1e-4)


@pytest.mark.local
def test_adaptive_follows_a_straggler_and_static_profiles_once() -> None:
    speeds = ["1,6:0.25,14:1", "1"]
    ad = run_threads(speeds, allocation="adaptive", steps=20, global_batch=100, per_sample_s=1e-3, update_every=1)[0]
    shares = [b[0] for b in ad.batch_sizes]
    assert shares[0] == 50 and min(shares[6:14]) < 30 and shares[-1] >= 45  # drops with the speed, comes back
    st = run_threads(["0.25", "1"], allocation="static", steps=3, global_batch=100,
                     per_sample_s=1e-3)[0]
    assert st.batch_sizes[0] == [20, 80]  # profiled speeds 1:4


@pytest.mark.local
def test_affine_cost_model_in_training() -> None:
    """Emulated compute is proportional, so the affine fit finds (almost) no fixed part and the same split;
    adaptive affine follows the straggler; torch compute defaults to the affine model."""
    st = run_threads(["0.25", "1"], allocation="static", steps=3, global_batch=100, per_sample_s=1e-3,
                     cost_model="affine")[0]
    assert sum(st.batch_sizes[0]) == 100 and abs(st.batch_sizes[0][0] - 20) <= 2
    ad = run_threads(["1,6:0.25,14:1", "1"], allocation="adaptive", steps=20, global_batch=100, per_sample_s=1e-3,
                     update_every=1, cost_model="affine")[0]
    shares = [b[0] for b in ad.batch_sizes]
    assert shares[0] == 50 and min(shares[6:14]) < 30 and shares[-1] >= 40
    assert TrainConfig(compute="torch").cost_model.value == "affine"
    assert TrainConfig().cost_model.value == "proportional" and TrainConfig().as_dict()["cost_model"] == "proportional"
    # (threads share torch's global seed, so the two models are not compared here: agents are processes)
    r0, r1 = run_threads(["0.5", "1"], allocation="static", compute="torch", steps=2, global_batch=40)
    assert r0.batch_sizes == r1.batch_sizes and sum(r0.batch_sizes[0]) == 40
