"""The affine cost model: robust fits of fake step timings, the equal-finish split, and both allocators using it."""
from __future__ import annotations

import numpy as np
import pytest

from host_agent.allocation import AdaptiveAllocator, AdaptiveConfig, cost_allocation, predicted_gain, static_allocation
from host_agent.cost_model import AffineCost, CostModel, equal_finish_shares, fit_affine


def test_fit_recovers_an_exact_affine_cost() -> None:
    b = [10, 20, 40, 80]
    c = fit_affine(b, [0.05 + 0.001 * x for x in b])
    assert c.fixed_s == pytest.approx(0.05) and c.per_sample_s == pytest.approx(0.001)


def test_fit_ignores_outlier_steps() -> None:
    """Two of ten steps slowed 4x by other load move the fit by nothing measurable (Theil-Sen)."""
    b = [20, 80] * 5
    t = [0.05 + 0.001 * x for x in b]
    t[3] *= 4
    t[6] *= 4
    c = fit_affine(b, t)
    assert c.fixed_s == pytest.approx(0.05) and c.per_sample_s == pytest.approx(0.001)


def test_fit_falls_back_to_proportional() -> None:
    one = fit_affine([40, 40, 40], [0.02, 0.03, 0.04])  # one batch size: the median per-sample time
    assert one.fixed_s == 0.0 and one.per_sample_s == pytest.approx(0.03 / 40)
    flat = fit_affine([10, 40], [0.05, 0.04])  # slope < 0
    assert flat.fixed_s == 0.0 and flat.per_sample_s == pytest.approx((0.005 + 0.001) / 2)
    assert fit_affine([10, 20], [0.001, 0.04]).fixed_s == 0.0  # intercept < 0: clamped
    with pytest.raises(ValueError):
        fit_affine([10, 0], [0.1, 0.1])
    with pytest.raises(ValueError):
        fit_affine([], [])


def test_equal_finish_shares_equalise_predicted_times() -> None:
    costs = [AffineCost(0.15, 0.003), AffineCost(0.05, 0.001), AffineCost(0.05, 0.001)]  # worker 0 3x slower
    shares = equal_finish_shares(costs, 240)
    assert sum(shares) == pytest.approx(240)
    finish = [c.seconds(b) for c, b in zip(costs, shares)]
    assert max(finish) - min(finish) == pytest.approx(0.0, abs=1e-12)
    # a large fixed part takes the slow worker to the minimum; the others share the rest equally
    costs = [AffineCost(0.5, 0.003), AffineCost(0.05, 0.001), AffineCost(0.05, 0.001)]
    assert equal_finish_shares(costs, 240, 2) == (2.0, pytest.approx(119.0), pytest.approx(119.0))


def test_equal_finish_without_fixed_cost_is_the_proportional_split() -> None:
    speeds = [1.0, 3.0, 3.0, 0.5]
    costs = [AffineCost.proportional(v) for v in speeds]
    assert cost_allocation(costs, 240).batch_sizes == static_allocation(speeds, 240).batch_sizes


def test_cost_allocation_is_exact_and_clamped() -> None:
    costs = [AffineCost(0.15, 0.003), AffineCost(0.05, 0.001), AffineCost(0.05, 0.001)]
    alloc = cost_allocation(costs, 240, min_batch=1, workers=("a", "b", "c"))
    assert alloc.workers == ("a", "b", "c") and alloc.global_batch == 240
    # T = (240 + 50 + 2 * 50) / (1/0.003 + 2/0.001) = 0.16714 s: b = 5.71, 117.14, 117.14, rounded to 240
    assert alloc.batch_sizes == (6, 117, 117)
    with pytest.raises(ValueError):
        cost_allocation(costs, 2)


def _steps(costs: list[AffineCost], batches: tuple[int, ...], k: int, noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(batches, [c.seconds(b) * (1 + noise * rng.random()) for c, b in zip(costs, batches)]) for _ in range(k)]


def test_adaptive_affine_converges_to_the_equal_finish_split() -> None:
    true = [AffineCost(0.15, 0.003), AffineCost(0.05, 0.001), AffineCost(0.05, 0.001)]
    cfg = AdaptiveConfig(240, update_every=2, max_change=0.5, jump=0.5, cost_model=CostModel.AFFINE)
    assert cfg.cost_model is CostModel.AFFINE
    a = AdaptiveAllocator.start(cfg, 3)
    for k in range(12):
        a = a.observe(_steps(true, a.allocation.batch_sizes, 2, noise=0.02, seed=k))
    best = cost_allocation(true, 240).batch_sizes
    assert all(abs(x - y) <= 3 for x, y in zip(a.allocation.batch_sizes, best)), (a.allocation, best)
    assert a.allocation.global_batch == 240 and a.updates == 12
    assert all(len(h) <= cfg.history for h in a.observations)


def test_adaptive_affine_drops_history_on_a_speed_change() -> None:
    """Worker 0 becomes 3x slower (fixed and per-sample): its old steps are dropped, the split follows."""
    fast = AffineCost(0.05, 0.001)
    cfg = AdaptiveConfig(240, update_every=2, max_change=0.5, jump=0.5, cost_model=CostModel.AFFINE)
    a = AdaptiveAllocator.start(cfg, 3)
    for _ in range(4):
        a = a.observe(_steps([fast] * 3, a.allocation.batch_sizes, 2))
    assert a.allocation.batch_sizes == (80, 80, 80) and len(a.observations[0]) == 8
    slow = [AffineCost(0.15, 0.003), fast, fast]
    a = a.observe(_steps(slow, a.allocation.batch_sizes, 2))
    assert len(a.observations[0]) == 2 and len(a.observations[1]) == 10  # only the changed worker restarts
    for _ in range(8):
        a = a.observe(_steps(slow, a.allocation.batch_sizes, 2))
    assert a.allocation.batch_sizes == cost_allocation(slow, 240).batch_sizes


def test_affine_history_is_reset_by_a_membership_change() -> None:
    cfg = AdaptiveConfig(240, cost_model=CostModel.AFFINE)
    a = AdaptiveAllocator.start(cfg, 3).observe(_steps([AffineCost(0.05, 0.001)] * 3, (80, 80, 80), 2))
    assert a.observations and not a.add_worker("w3").observations
    with pytest.raises(ValueError):
        a.observe([((80, 80), (0.1, 0.1))])
    with pytest.raises(ValueError):
        AdaptiveConfig(240, history=1)


def test_predicted_gain_is_the_saving_of_the_slowest_predicted_compute() -> None:
    costs = [AffineCost(0.15, 0.003), AffineCost(0.05, 0.001), AffineCost(0.05, 0.001)]
    # equal: worker 0 takes 0.39 s; (6, 117, 117): max(0.168, 0.167, 0.167) = 0.168 s
    assert predicted_gain(costs, (80, 80, 80), (6, 117, 117)) == pytest.approx(1 - 0.168 / 0.39)
    assert predicted_gain(costs, (6, 117, 117), (6, 117, 117)) == 0.0


def test_adaptive_affine_does_not_shuffle_samples_that_save_nothing() -> None:
    """Near the minimum batch a move of one sample is a 50 % change of the batch but < 1 % of the step: the
    allocator keeps its split unless the predicted slowest compute falls by the deadband."""
    true = [AffineCost(0.15, 0.003), AffineCost(0.05, 0.001), AffineCost(0.05, 0.001)]
    cfg = AdaptiveConfig(240, update_every=2, max_change=0.5, jump=0.5, deadband=0.05, cost_model=CostModel.AFFINE)
    a = AdaptiveAllocator.start(cfg, 3)
    for k in range(12):
        a = a.observe(_steps(true, a.allocation.batch_sizes, 2, noise=0.02, seed=k))
    settled = a.allocation
    moves = 0
    for k in range(20):  # up to 50 % noise on every step: the fits move (a split that follows them: 10 moves)
        b = a.allocation
        a = a.observe(_steps(true, a.allocation.batch_sizes, 2, noise=0.5, seed=100 + k))
        moves += a.allocation != b
    assert moves <= 5, (settled, a.allocation)
    best = cost_allocation(true, 240).batch_sizes
    assert max(c.seconds(b) for c, b in zip(true, a.allocation.batch_sizes)) <= 1.15 * max(
        c.seconds(b) for c, b in zip(true, best))


def test_one_slowed_step_is_not_a_change_of_speed() -> None:
    """A window of two steps, one of them twice as long (other load), keeps the worker's history; a window
    whose every step is three times as long (the straggler) drops it."""
    fast = AffineCost(0.05, 0.001)
    cfg = AdaptiveConfig(240, update_every=2, max_change=0.5, jump=0.5, cost_model=CostModel.AFFINE)
    a = AdaptiveAllocator.start(cfg, 3)
    for _ in range(3):
        a = a.observe(_steps([fast] * 3, a.allocation.batch_sizes, 2))
    t = fast.seconds(80)
    a = a.observe([((80, 80, 80), (2 * t, t, t)), ((80, 80, 80), (t, t, t))])
    assert len(a.observations[0]) == 8 and a.allocation.batch_sizes == (80, 80, 80)
    a = a.observe([((80, 80, 80), (3 * t, t, t)), ((80, 80, 80), (3 * t, t, t))])
    assert len(a.observations[0]) == 2 and len(a.observations[1]) == 10
