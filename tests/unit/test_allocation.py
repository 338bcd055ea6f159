"""Data allocation: proportional batch sizes, shared permutation, unbiased scaling, self-adaptation."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.allocation import (
    AdaptiveAllocator,
    AdaptiveConfig,
    Allocation,
    ComputeMeter,
    SlowdownCompute,
    apportion,
    epoch_batches,
    epoch_permutation,
    gradient_scales,
    membership_speeds,
    profile_speed,
    proportional_shares,
    static_allocation,
)

speeds_st = st.lists(st.floats(0.01, 100.0, allow_nan=False, allow_infinity=False), min_size=1, max_size=8)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


# --------------------------------------------------------------------------- static


def test_shares_are_proportional() -> None:
    assert proportional_shares([1, 3]) == (0.25, 0.75)
    with pytest.raises(ValueError, match="> 0"):
        proportional_shares([1.0, 0.0])


def test_static_allocation_follows_speed() -> None:
    alloc = static_allocation([1.0, 2.0, 3.0, 4.0], 100)
    assert alloc.batch_sizes == (10, 20, 30, 40)
    assert alloc.workers == ("w0", "w1", "w2", "w3")
    assert alloc.offsets == (0, 10, 30, 60)
    assert alloc.global_batch == 100


def test_largest_remainder_rounding() -> None:
    # quotas 3.333.., 3.333.., 3.333..: one extra sample, to the lowest index on a tie
    assert apportion([1, 1, 1], 10) == (4, 3, 3)
    # quotas 1.4, 2.8, 5.8 -> floors 1, 2, 5; remainders .4, .8, .8 -> +1 to w1 and w2
    assert apportion([1.4, 2.8, 5.8], 10) == (1, 3, 6)


@settings(max_examples=200, deadline=None)
@given(speeds=speeds_st, extra=st.integers(0, 500), min_batch=st.integers(1, 8))
def test_rounding_sums_to_B_and_respects_min(speeds: list[float], extra: int, min_batch: int) -> None:
    B = len(speeds) * min_batch + extra
    sizes = static_allocation(speeds, B, min_batch=min_batch).batch_sizes
    assert sum(sizes) == B
    assert min(sizes) >= min_batch
    # each worker not held at the minimum is within one sample of its proportional quota
    # among the workers that share what the minimum leaves over
    free = [i for i, b in enumerate(sizes) if b > min_batch]
    if free:
        rest = sum(sizes[i] for i in free)
        wsum = sum(Fraction(speeds[i]) for i in free)
        for i in free:
            assert abs(sizes[i] - rest * Fraction(speeds[i]) / wsum) < 1


def test_min_batch_lifts_slow_workers_and_rejects_small_B() -> None:
    assert static_allocation([1.0, 100.0, 100.0], 40, min_batch=4).batch_sizes == (4, 18, 18)
    with pytest.raises(ValueError, match="at least 4"):
        static_allocation([1.0, 1.0, 1.0], 11, min_batch=4)
    with pytest.raises(ValueError, match="min_batch"):
        static_allocation([1.0], 10, min_batch=0)


def test_every_worker_runs_the_same_steps_per_epoch() -> None:
    alloc = static_allocation([1.0, 2.5, 7.0], 64)
    dataset = 1000
    counts = [sum(1 for _ in epoch_batches(alloc, r, seed=1, epoch=0, dataset_size=dataset)) for r in range(3)]
    assert counts == [dataset // 64] * 3
    with pytest.raises(ValueError, match="smaller than one global batch"):
        alloc.steps_per_epoch(63)


def test_permutation_is_seeded_by_seed_and_epoch() -> None:
    a = epoch_permutation(7, 3, 500)
    np.testing.assert_array_equal(a, epoch_permutation(7, 3, 500))
    assert not np.array_equal(a, epoch_permutation(7, 4, 500))
    assert not np.array_equal(a, epoch_permutation(8, 3, 500))
    np.testing.assert_array_equal(np.sort(a), np.arange(500))


@settings(max_examples=50, deadline=None)
@given(speeds=speeds_st, B=st.integers(8, 64), extra=st.integers(0, 100), epoch=st.integers(0, 5))
def test_workers_slices_are_disjoint_and_cover_each_global_batch(speeds, B, extra, epoch) -> None:
    B = max(B, len(speeds))
    alloc = static_allocation(speeds, B)
    dataset = 3 * B + extra
    perm = epoch_permutation(11, epoch, dataset)
    per_worker = [list(epoch_batches(alloc, r, seed=11, epoch=epoch, dataset_size=dataset)) for r in range(alloc.size)]
    seen: list[int] = []
    for step in range(alloc.steps_per_epoch(dataset)):
        union = np.concatenate([per_worker[r][step] for r in range(alloc.size)])
        assert len(union) == B and len(set(union.tolist())) == B  # one global batch, no overlap
        assert sorted(union.tolist()) == sorted(perm[step * B : (step + 1) * B].tolist())
        for r in range(alloc.size):
            assert len(per_worker[r][step]) == alloc.batch_sizes[r]
        seen.extend(union.tolist())
    assert len(seen) == len(set(seen))  # nothing is used twice in an epoch


def test_indices_out_of_range() -> None:
    alloc = static_allocation([1.0, 1.0], 10)
    perm = epoch_permutation(0, 0, 25)
    with pytest.raises(IndexError):
        alloc.indices(perm, 0, 2)
    with pytest.raises(IndexError):
        alloc.indices(perm, 2, 0)


def test_allocation_validates() -> None:
    with pytest.raises(ValueError, match="unique"):
        Allocation(("a", "a"), (1, 1))
    with pytest.raises(ValueError, match=">= 1"):
        Allocation(("a", "b"), (0, 2))
    with pytest.raises(ValueError, match="2 workers but 1"):
        Allocation(("a", "b"), (2,))


# --------------------------------------------------------------------------- unbiasedness


@settings(max_examples=100, deadline=None)
@given(speeds=speeds_st, B=st.integers(8, 200), seed=st.integers(0, 2**16))
def test_scaled_worker_means_sum_to_the_global_mean(speeds: list[float], B: int, seed: int) -> None:
    B = max(B, len(speeds))
    alloc = static_allocation(speeds, B)
    rng = np.random.default_rng(seed)
    per_sample = rng.standard_normal((B, 5))  # gradient of each sample of one global batch
    perm = rng.permutation(B)
    total = np.zeros(5)
    for rank, scale in enumerate(gradient_scales(alloc)):
        idx = alloc.indices(perm, rank, 0)
        total += scale * per_sample[idx].mean(axis=0)
    np.testing.assert_allclose(total, per_sample.mean(axis=0), rtol=1e-12, atol=1e-12)
    assert sum(gradient_scales(alloc)) == pytest.approx(1.0)


# --------------------------------------------------------------------------- measurement


def test_compute_meter_counts_compute_only() -> None:
    clock = FakeClock()
    meter = ComputeMeter(clock)
    for _ in range(3):
        with meter.measure(32):
            clock.advance(0.1)  # compute
        clock.advance(5.0)  # waiting in all-reduce: not counted
    assert meter.speed == pytest.approx(320.0)
    assert meter.take() == pytest.approx(320.0)
    with pytest.raises(ValueError, match="no compute"):
        meter.take()


def test_profile_speed() -> None:
    clock = FakeClock()
    calls = []

    def compute(b: int) -> None:
        calls.append(b)
        clock.advance(b / 400.0)

    assert profile_speed(compute, 20, repeats=4, warmup=1, clock=clock) == pytest.approx(400.0)
    assert calls == [20] * 5


def test_slowdown_waits_f_minus_one_times_compute() -> None:
    clock = FakeClock()
    slept: list[float] = []

    def sleep(dt: float) -> None:
        slept.append(dt)
        clock.advance(dt)

    slow = SlowdownCompute(3.0, clock=clock, sleep=sleep)

    def compute(x: int) -> int:
        clock.advance(0.02)
        return x * 2

    assert slow(compute, 21) == 42
    assert slept == [pytest.approx(0.04)]
    assert slow.wrap(compute)(1) == 2
    assert clock.now == pytest.approx(0.12)


def test_slowdown_spin_and_identity() -> None:
    clock = FakeClock()

    def ticking() -> float:  # each reading advances time, so the spin loop ends
        clock.advance(0.001)
        return clock.now

    slow = SlowdownCompute(2.0, mode="spin", clock=ticking, sleep=lambda _: pytest.fail("spin must not sleep"))
    slow(lambda: clock.advance(0.05))
    assert clock.now >= 0.1
    SlowdownCompute(1.0, sleep=lambda _: pytest.fail("factor 1 must not wait"))(lambda: None)
    with pytest.raises(ValueError, match=">= 1"):
        SlowdownCompute(0.5)


@pytest.mark.local
def test_slowdown_really_waits() -> None:
    """With the real clock and sleep: the slowed call lasts at least f times its own compute."""
    import time

    compute_time: list[float] = []

    def work() -> None:
        t0 = time.perf_counter()
        sum(range(20_000))
        compute_time.append(time.perf_counter() - t0)

    start = time.perf_counter()
    SlowdownCompute(3.0)(work)
    total = time.perf_counter() - start
    assert total >= 3.0 * compute_time[0] - 1e-3  # sleep never returns early; 1 ms for clock granularity


# --------------------------------------------------------------------------- self-adaptive


def test_adaptation_converges_to_a_new_speed_ratio() -> None:
    cfg = AdaptiveConfig(global_batch=120, smoothing=0.5, deadband=0.02, max_change=0.25, update_every=10)
    alloc = AdaptiveAllocator.start(cfg, 3)
    assert alloc.allocation.batch_sizes == (40, 40, 40)
    for _ in range(10):  # equal speeds: nothing moves
        alloc = alloc.update([100.0, 100.0, 100.0])
    assert alloc.allocation.batch_sizes == (40, 40, 40)
    history = []
    for _ in range(40):  # worker 0 becomes 4x faster than the others
        alloc = alloc.update([400.0, 100.0, 100.0])
        history.append(alloc.allocation.batch_sizes)
    assert history[-1] == (80, 20, 20)
    assert history[0] != (80, 20, 20)  # clamped: not in one jump
    assert alloc.updates == 50


def test_updates_are_clamped() -> None:
    cfg = AdaptiveConfig(global_batch=200, smoothing=1.0, deadband=0.0, max_change=0.1)
    alloc = AdaptiveAllocator.start(cfg, 2)
    before = alloc.allocation.batch_sizes
    after = alloc.update([900.0, 100.0]).allocation.batch_sizes
    assert sum(after) == 200
    assert max(abs(b - a) / a for a, b in zip(before, after)) <= 0.1 + 1 / min(before)  # up to rounding
    assert after == (110, 90)


def test_clamp_always_allows_one_sample() -> None:
    cfg = AdaptiveConfig(global_batch=4, smoothing=1.0, deadband=0.0, max_change=0.01)
    alloc = AdaptiveAllocator.start(cfg, 2)
    for _ in range(3):
        alloc = alloc.update([3.0, 1.0])
    assert alloc.allocation.batch_sizes == (3, 1)


def test_deadband_ignores_small_changes() -> None:
    cfg = AdaptiveConfig(global_batch=100, smoothing=1.0, deadband=0.1, max_change=1.0)
    alloc = AdaptiveAllocator.start(cfg, 2)
    nudged = alloc.update([104.0, 96.0])  # target (52, 48): 4% change < 10%
    assert nudged.allocation == alloc.allocation
    assert nudged.speeds == (104.0, 96.0)  # measurement still folded in
    moved = alloc.update([130.0, 70.0])  # target (65, 35): 30% change
    assert moved.allocation.batch_sizes == (65, 35)


def test_smoothing_is_an_exponential_average() -> None:
    cfg = AdaptiveConfig(global_batch=100, smoothing=0.25)
    alloc = AdaptiveAllocator.start(cfg, 2, speeds=[100.0, 100.0]).update([200.0, 100.0])
    assert alloc.speeds == (125.0, 100.0)


def test_same_history_gives_the_same_allocation_on_every_worker() -> None:
    cfg = AdaptiveConfig(global_batch=256, min_batch=4)
    rng = np.random.default_rng(5)
    history = [rng.uniform(50, 500, size=4).tolist() for _ in range(30)]

    def replay() -> AdaptiveAllocator:
        alloc = AdaptiveAllocator.start(cfg, ["a", "b", "c", "d"])
        for speeds in history:
            alloc = alloc.update(speeds)
        return alloc

    first = replay()
    assert all(replay() == first for _ in range(3))
    assert sum(first.allocation.batch_sizes) == 256 and min(first.allocation.batch_sizes) >= 4


def test_due_every_k_steps_or_every_epoch() -> None:
    by_steps = AdaptiveAllocator.start(AdaptiveConfig(global_batch=8, update_every=5), 2)
    assert [s for s in range(16) if by_steps.due(s, steps_per_epoch=7)] == [5, 10, 15]
    by_epoch = AdaptiveAllocator.start(AdaptiveConfig(global_batch=8, update_every=None), 2)
    assert [s for s in range(16) if by_epoch.due(s, steps_per_epoch=7)] == [7, 14]


def test_config_validates() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        AdaptiveConfig(global_batch=10, smoothing=0.0)
    with pytest.raises(ValueError, match="deadband"):
        AdaptiveConfig(global_batch=10, deadband=1.0)
    with pytest.raises(ValueError, match="max_change"):
        AdaptiveConfig(global_batch=10, max_change=0.0)
    with pytest.raises(ValueError, match="expected 2 speeds"):
        AdaptiveAllocator.start(AdaptiveConfig(global_batch=10), 2).update([1.0])


# --------------------------------------------------------------------------- membership


def test_new_worker_starts_at_the_mean_speed() -> None:
    cfg = AdaptiveConfig(global_batch=100)
    alloc = AdaptiveAllocator.start(cfg, ["a", "b"], speeds=[100.0, 300.0])
    assert alloc.allocation.batch_sizes == (25, 75)
    grown = alloc.add_worker("c")
    assert grown.allocation.workers == ("a", "b", "c")
    assert grown.speeds == (100.0, 300.0, 200.0)
    assert grown.allocation.batch_sizes == (17, 50, 33)
    assert sum(grown.allocation.batch_sizes) == 100


def test_new_worker_with_a_profile() -> None:
    alloc = AdaptiveAllocator.start(AdaptiveConfig(global_batch=90), ["a", "b"], speeds=[100.0, 100.0])
    assert alloc.add_worker("c", speed=700.0).allocation.batch_sizes == (10, 10, 70)


def test_remove_and_replace_worker() -> None:
    alloc = AdaptiveAllocator.start(AdaptiveConfig(global_batch=60), ["a", "b", "c"], speeds=[100.0, 100.0, 400.0])
    assert alloc.allocation.batch_sizes == (10, 10, 40)
    removed = alloc.remove_worker("c")
    assert removed.allocation.workers == ("a", "b") and removed.allocation.batch_sizes == (30, 30)
    replaced = alloc.replace_worker("a", "z", speed=400.0)  # a slow worker swapped for a fast one
    assert replaced.allocation.workers == ("z", "b", "c")
    assert replaced.allocation.batch_sizes == (27, 7, 26)  # 26.67, 6.67, 26.67: ties to lower rank
    unknown = alloc.replace_worker("a", "y")
    assert unknown.speeds == (200.0, 100.0, 400.0)
    with pytest.raises(KeyError, match="unknown worker"):
        alloc.remove_worker("nope")
    with pytest.raises(ValueError, match="already a member"):
        alloc.add_worker("b")


def test_membership_speeds_for_a_static_allocation() -> None:
    speeds = membership_speeds(["a", "b"], [1.0, 3.0], ["b", "c", "d"], profiles={"d": 8.0})
    assert speeds == (3.0, 2.0, 8.0)
    assert static_allocation(speeds, 26, workers=["b", "c", "d"]).batch_sizes == (6, 4, 16)


def test_a_jump_replaces_the_average_and_noise_is_averaged() -> None:
    cfg = AdaptiveConfig(global_batch=100, smoothing=0.5, deadband=0.0, max_change=1.0, jump=0.5)
    alloc = AdaptiveAllocator.start(cfg, 2, speeds=[100.0, 100.0])
    noisy = alloc.update([130.0, 100.0])  # 30 % off: averaged
    assert noisy.speeds == (115.0, 100.0)
    dropped = alloc.update([25.0, 100.0])  # 75 % off: a real change, taken at once
    assert dropped.speeds == (25.0, 100.0) and dropped.allocation.batch_sizes == (20, 80)
    assert dropped.update([100.0, 100.0]).speeds == (100.0, 100.0)  # +300 %: the recovery too
    with pytest.raises(ValueError, match="jump"):
        AdaptiveConfig(global_batch=10, jump=0.0)
