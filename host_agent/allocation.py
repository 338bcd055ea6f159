"""Data allocation for heterogeneous workers: per-worker batch sizes proportional to speed.

Implements the static and self-adaptive allocation of Chao, Liao and Gao, "Task allocation for
decentralized training in heterogeneous environment" (arXiv:2111.08272): a worker that is k times
faster gets k times more samples of each global batch, so that all workers finish their compute at
the same moment and nobody waits in all-reduce.

Everything here is deterministic and free of I/O: every worker computes the same allocation from
the same (all-gathered) numbers, so no coordinator is needed. See docs/agent-allocation.md.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Literal, ParamSpec, TypeVar

import numpy as np

from host_agent.cost_model import AffineCost, CostModel, equal_finish_shares, fit_affine

__all__ = [
    "AdaptiveAllocator",
    "AdaptiveConfig",
    "Allocation",
    "ComputeMeter",
    "SlowdownCompute",
    "apportion",
    "cost_allocation",
    "default_workers",
    "epoch_batches",
    "epoch_permutation",
    "gradient_scales",
    "membership_speeds",
    "predicted_gain",
    "profile_speed",
    "proportional_shares",
    "static_allocation",
]

P = ParamSpec("P")
T = TypeVar("T")


# --------------------------------------------------------------------------- apportionment


def _check_speeds(speeds: Sequence[float], n: int | None = None) -> tuple[float, ...]:
    values = tuple(float(s) for s in speeds)
    if not values:
        raise ValueError("need at least one worker speed")
    if n is not None and len(values) != n:
        raise ValueError(f"expected {n} speeds, got {len(values)}")
    for i, s in enumerate(values):
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"speed of worker {i} must be finite and > 0, got {s!r}")
    return values


def proportional_shares(speeds: Sequence[float]) -> tuple[float, ...]:
    """Each worker's fraction s_i / sum(s) of the global batch: equal finish times need it."""
    values = _check_speeds(speeds)
    total = math.fsum(values)
    return tuple(s / total for s in values)


def apportion(weights: Sequence[float | Fraction], total: int, minimum: int = 1) -> tuple[int, ...]:
    """Split ``total`` into integers proportional to ``weights``, each at least ``minimum``.

    Workers whose proportional quota falls below ``minimum`` get exactly ``minimum`` and the rest is
    shared among the others in proportion (water-filling); the fractional quotas are then rounded
    by largest remainder, ties to the lower index. The arithmetic is exact (fractions), so every
    worker gets the same answer from the same inputs. Raises ValueError if total < n * minimum.
    """
    if not weights:
        raise ValueError("need at least one weight")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"total must be an int >= 0, got {total!r}")
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 0:
        raise ValueError(f"minimum must be an int >= 0, got {minimum!r}")
    w = [Fraction(x) for x in weights]
    if any(x <= 0 for x in w):
        raise ValueError(f"weights must be > 0, got {list(weights)!r}")
    n = len(w)
    if total < n * minimum:
        raise ValueError(f"cannot give {n} workers at least {minimum} each out of {total}")

    fixed: set[int] = set()
    while True:
        free = [i for i in range(n) if i not in fixed]
        rest = total - minimum * len(fixed)
        wsum = sum(w[i] for i in free)
        below = [i for i in free if rest * w[i] / wsum < minimum]
        if not below:
            break
        fixed.update(below)  # never empties `free`: total >= n * minimum

    out = [minimum] * n
    quotas = {i: rest * w[i] / wsum for i in free}
    for i in free:
        out[i] = math.floor(quotas[i])
    leftover = rest - sum(out[i] for i in free)
    by_remainder = sorted(free, key=lambda i: (-(quotas[i] - out[i]), i))
    for i in by_remainder[:leftover]:  # 0 <= leftover < len(free): exact arithmetic
        out[i] += 1
    return tuple(out)


# --------------------------------------------------------------------------- allocation


def default_workers(n: int) -> tuple[str, ...]:
    """Worker ids "w0".."w{n-1}", used when the caller does not name its workers."""
    if n < 1:
        raise ValueError(f"need at least one worker, got {n}")
    return tuple(f"w{i}" for i in range(n))


@dataclass(frozen=True)
class Allocation:
    """Per-worker batch sizes b_i of one global batch B = sum(b_i); worker order is rank order.

    At every step the workers take consecutive slices of the same B indices (worker i the slice at
    ``offsets[i]``), so the union of one step is exactly one global batch, without overlap.
    """

    workers: tuple[str, ...]
    batch_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(self.workers))
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        if not self.workers:
            raise ValueError("an allocation needs at least one worker")
        if len(self.workers) != len(self.batch_sizes):
            raise ValueError(f"{len(self.workers)} workers but {len(self.batch_sizes)} batch sizes")
        if len(set(self.workers)) != len(self.workers):
            raise ValueError(f"worker ids must be unique, got {self.workers!r}")
        for wid, b in zip(self.workers, self.batch_sizes):
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ValueError(f"batch size of {wid!r} must be an int >= 1, got {b!r}")

    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def global_batch(self) -> int:
        return sum(self.batch_sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Start of each worker's slice inside a step's B indices."""
        out, acc = [], 0
        for b in self.batch_sizes:
            out.append(acc)
            acc += b
        return tuple(out)

    @property
    def shares(self) -> tuple[float, ...]:
        return tuple(b / self.global_batch for b in self.batch_sizes)

    def rank_of(self, worker: str) -> int:
        try:
            return self.workers.index(worker)
        except ValueError:
            raise KeyError(f"unknown worker {worker!r}; workers are {self.workers!r}") from None

    def steps_per_epoch(self, dataset_size: int) -> int:
        """Steps every worker runs per epoch: each step consumes one global batch (last partial dropped)."""
        if dataset_size < self.global_batch:
            raise ValueError(f"dataset of {dataset_size} samples is smaller than one global batch {self.global_batch}")
        return dataset_size // self.global_batch

    def gradient_scale(self, rank: int) -> float:
        """b_i / B: weight of worker i's mean gradient so that the all-reduced sum is the global mean."""
        return self.batch_sizes[rank] / self.global_batch

    def indices(self, permutation: np.ndarray, rank: int, step: int) -> np.ndarray:
        """Worker ``rank``'s sample indices at ``step`` of an epoch, from the epoch's shared permutation."""
        if not 0 <= rank < self.size:
            raise IndexError(f"rank {rank} out of range for {self.size} workers")
        B = self.global_batch
        if step < 0 or (step + 1) * B > len(permutation):
            raise IndexError(f"step {step} out of range: {len(permutation)} samples give {len(permutation) // B} steps of {B}")
        start = step * B + self.offsets[rank]
        return permutation[start : start + self.batch_sizes[rank]]


def gradient_scales(allocation: Allocation) -> tuple[float, ...]:
    """All workers' b_i / B. sum_i (b_i/B) * mean over b_i samples == mean over the B samples."""
    return tuple(allocation.gradient_scale(i) for i in range(allocation.size))


def static_allocation(
    speeds: Sequence[float],
    global_batch: int,
    *,
    min_batch: int = 1,
    workers: Sequence[str] | None = None,
) -> Allocation:
    """Batch sizes proportional to given or profiled speeds, summing exactly to ``global_batch``."""
    values = _check_speeds(speeds)
    if min_batch < 1:
        raise ValueError(f"min_batch must be >= 1 (a worker with no samples has no mean gradient), got {min_batch}")
    ids = default_workers(len(values)) if workers is None else tuple(workers)
    return Allocation(ids, apportion(values, global_batch, min_batch))


def cost_allocation(
    costs: Sequence[AffineCost],
    global_batch: int,
    *,
    min_batch: int = 1,
    workers: Sequence[str] | None = None,
) -> Allocation:
    """Batch sizes with equal predicted finishing times a_i + c_i b_i (``equal_finish_shares``), rounded exactly."""
    ids = default_workers(len(costs)) if workers is None else tuple(workers)
    shares = equal_finish_shares(costs, global_batch, min_batch)
    return Allocation(ids, apportion([Fraction(x) for x in shares], global_batch, min_batch))


def epoch_permutation(seed: int, epoch: int, dataset_size: int) -> np.ndarray:
    """The epoch's sample order, identical on every worker: a numpy Generator seeded by (seed, epoch)."""
    if seed < 0 or epoch < 0 or dataset_size < 0:
        raise ValueError(f"seed, epoch and dataset_size must be >= 0, got {seed}, {epoch}, {dataset_size}")
    return np.random.default_rng([seed, epoch]).permutation(dataset_size)


def epoch_batches(allocation: Allocation, rank: int, *, seed: int, epoch: int, dataset_size: int) -> Iterator[np.ndarray]:
    """Worker ``rank``'s index batches for one epoch under a fixed (static) allocation."""
    perm = epoch_permutation(seed, epoch, dataset_size)
    for step in range(allocation.steps_per_epoch(dataset_size)):
        yield allocation.indices(perm, rank, step)


def membership_speeds(
    workers: Sequence[str],
    speeds: Sequence[float],
    new_workers: Sequence[str],
    profiles: Mapping[str, float] | None = None,
) -> tuple[float, ...]:
    """Speeds for a new membership: known workers keep theirs, a given profile wins, others get the mean.

    The mean is taken over the old membership, so a newcomer neither starves nor stalls the first
    steps before the adaptive allocator has measured it.
    """
    if len(set(new_workers)) != len(new_workers):
        raise ValueError(f"worker ids must be unique, got {tuple(new_workers)!r}")
    old = dict(zip(workers, _check_speeds(speeds, len(workers))))
    mean = math.fsum(old.values()) / len(old)
    profiles = dict(profiles or {})
    return _check_speeds([profiles[w] if w in profiles else old.get(w, mean) for w in new_workers])


# --------------------------------------------------------------------------- measurement


class ComputeMeter:
    """Accumulates compute time and samples of one worker over a measurement window.

    Only the forward/backward compute is timed, never the wall time of a step: in synchronous
    training every worker waits for the slowest in all-reduce, so wall time per step is the same
    everywhere and says nothing about a worker's own speed.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.samples = 0
        self.seconds = 0.0

    @contextmanager
    def measure(self, samples: int) -> Iterator[None]:
        start = self._clock()
        yield
        self.add(samples, self._clock() - start)

    def add(self, samples: int, seconds: float) -> None:
        if samples < 0 or seconds < 0:
            raise ValueError(f"samples and seconds must be >= 0, got {samples}, {seconds}")
        self.samples += samples
        self.seconds += seconds

    @property
    def speed(self) -> float:
        """Samples per second of compute over the window."""
        if self.samples == 0 or self.seconds <= 0:
            raise ValueError("no compute measured in this window")
        return self.samples / self.seconds

    def take(self) -> float:
        """The window's speed, starting a new window."""
        s = self.speed
        self.samples, self.seconds = 0, 0.0
        return s


def profile_speed(
    compute: Callable[[int], object],
    batch_size: int,
    *,
    repeats: int = 3,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Samples/s of ``compute(batch_size)``, after ``warmup`` untimed runs, for a static allocation."""
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need batch_size >= 1, repeats >= 1, warmup >= 0; got {batch_size}, {repeats}, {warmup}")
    for _ in range(warmup):
        compute(batch_size)
    meter = ComputeMeter(clock)
    for _ in range(repeats):
        with meter.measure(batch_size):
            compute(batch_size)
    return meter.speed


@dataclass(frozen=True)
class SlowdownCompute:
    """Makes a worker ``factor`` times slower: runs the real compute (time t), then waits (f-1)*t more.

    The testbed's machines have identical cores, so heterogeneity is emulated. The default waits by
    sleeping: several workers share 2 cores, and a spinning worker would take a core from another
    worker's real compute, slowing the fast workers too and distorting the ratio under test; a
    sleeping worker behaves like a slow accelerator, busy but not using the host CPU. Sleep
    overshoots by tens of microseconds, which is negligible for compute of milliseconds.
    ``mode="spin"`` busy-waits instead, for when each worker has a core of its own and
    sub-millisecond accuracy matters.
    """

    factor: float = 1.0
    mode: Literal["sleep", "spin"] = "sleep"
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise ValueError(f"slowdown factor must be finite and >= 1, got {self.factor!r}")
        if self.mode not in ("sleep", "spin"):
            raise ValueError(f"mode must be 'sleep' or 'spin', got {self.mode!r}")

    def __call__(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        start = self.clock()
        result = fn(*args, **kwargs)
        now = self.clock()
        pad = (self.factor - 1.0) * (now - start)
        if pad > 0:
            if self.mode == "sleep":
                self.sleep(pad)
            else:
                end = now + pad
                while self.clock() < end:
                    pass
        return result

    def wrap(self, fn: Callable[P, T]) -> Callable[P, T]:
        """``fn`` slowed down, for handing to code that calls it."""

        def slowed(*args: P.args, **kwargs: P.kwargs) -> T:
            return self(fn, *args, **kwargs)

        return slowed


# --------------------------------------------------------------------------- self-adaptive


@dataclass(frozen=True)
class AdaptiveConfig:
    """Knobs of the self-adaptive allocator.

    Args:
        global_batch: B, fixed across updates and membership changes (it is a hyperparameter).
        min_batch: smallest b_i; a worker never drops to 0 so it keeps being measured.
        update_every: K, update every K steps; None updates at each epoch start.
        smoothing: weight of the newest measurement in the exponential moving average of speeds.
        jump: a measurement that differs from the average by more than this fraction of it replaces
            the average (a real change of speed, not noise: react at once instead of over several
            updates); None: always average.
        deadband: no change unless some b_i would change by at least this fraction of itself.
        max_change: largest fraction by which any b_i moves per update (at least one sample).
        cost_model: proportional (``update``: smoothed speeds) or affine (``observe``: a robust fit of
            each worker's last ``history`` steps, host_agent/cost_model.py).
        history: affine: steps per worker the fit uses.
    """

    global_batch: int
    min_batch: int = 1
    update_every: int | None = 50
    smoothing: float = 0.5
    deadband: float = 0.05
    max_change: float = 0.25
    jump: float | None = None
    cost_model: CostModel = CostModel.PROPORTIONAL
    history: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost_model", CostModel(self.cost_model))
        if self.history < 2:
            raise ValueError(f"history must be >= 2 steps, got {self.history}")
        if self.min_batch < 1:
            raise ValueError(f"min_batch must be >= 1, got {self.min_batch}")
        if self.global_batch < self.min_batch:
            raise ValueError(f"global_batch {self.global_batch} is smaller than min_batch {self.min_batch}")
        if self.update_every is not None and self.update_every < 1:
            raise ValueError(f"update_every must be >= 1 or None, got {self.update_every}")
        if not 0.0 < self.smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if not 0.0 <= self.deadband < 1.0:
            raise ValueError(f"deadband must be in [0, 1), got {self.deadband}")
        if not self.max_change > 0.0:
            raise ValueError(f"max_change must be > 0, got {self.max_change}")
        if self.jump is not None and not self.jump > 0.0:
            raise ValueError(f"jump must be > 0 or None, got {self.jump}")


def predicted_gain(costs: Sequence[AffineCost], current: Sequence[int], target: Sequence[int]) -> float:
    """How much shorter the slowest predicted compute is under ``target`` than under ``current`` (a fraction).

    The affine allocator's deadband is on this, not only on the batches: near the minimum batch a move of
    one sample is a large relative change of the batch but saves almost nothing, and noisy fits would
    otherwise shuffle such samples at every update.
    """
    now = max(c.seconds(b) for c, b in zip(costs, current))
    return 1.0 - max(c.seconds(t) for c, t in zip(costs, target)) / now


def _max_relative_change(old: Sequence[int], new: Sequence[int]) -> float:
    return max(abs(b - a) / a for a, b in zip(old, new))


@dataclass(frozen=True)
class AdaptiveAllocator:
    """Self-adaptive allocation as an immutable value: ``update`` returns the next allocator.

    It is a pure function of the measurement history, so workers that feed it the same
    all-gathered speeds in the same order hold identical allocations without talking further.
    Apply a new allocation at a step boundary, the same step on every worker.
    """

    config: AdaptiveConfig
    allocation: Allocation
    speeds: tuple[float, ...]  # smoothed samples/s, in allocation.workers order
    updates: int = 0
    observations: tuple[tuple[tuple[int, float], ...], ...] = ()  # affine: each worker's recent (batch, seconds)
    fits: tuple[AffineCost, ...] = ()  # affine: each worker's cost fitted to ``observations``

    @classmethod
    def start(
        cls,
        config: AdaptiveConfig,
        workers: int | Sequence[str],
        speeds: Sequence[float] | None = None,
    ) -> AdaptiveAllocator:
        """Begin from profiled speeds, or from equal shares when nothing is known yet."""
        ids = default_workers(workers) if isinstance(workers, int) else tuple(workers)
        values = (1.0,) * len(ids) if speeds is None else _check_speeds(speeds, len(ids))
        return cls(config, static_allocation(values, config.global_batch, min_batch=config.min_batch, workers=ids), values)

    def due(self, step: int, steps_per_epoch: int) -> bool:
        """Whether to measure and update before global step ``step`` (counted from 0 across epochs)."""
        period = steps_per_epoch if self.config.update_every is None else self.config.update_every
        return step > 0 and step % period == 0

    def update(self, measured: Sequence[float]) -> AdaptiveAllocator:
        """Fold in one round of measured speeds (samples/s of compute, all workers, rank order)."""
        cfg = self.config
        m = _check_speeds(measured, self.allocation.size)
        a = cfg.smoothing
        smoothed = tuple(x if cfg.jump is not None and abs(x - s) > cfg.jump * s else a * x + (1.0 - a) * s
                         for x, s in zip(m, self.speeds))
        target = apportion(smoothed, cfg.global_batch, cfg.min_batch)
        return replace(self, speeds=smoothed, updates=self.updates + 1).moved_towards(target)

    def observe(self, steps: Sequence[tuple[Sequence[int], Sequence[float]]]) -> AdaptiveAllocator:
        """Affine cost model: fold in a window's steps (each: every worker's batch and compute seconds).

        Each worker keeps its last ``history`` steps and fits ``fit_affine`` to them (robust to a few
        steps slowed by other load). If *every* step of the window is off the previous fit's prediction by
        more than ``jump`` of it in the same direction, the worker's older steps are dropped (a real change
        of speed; a single step slowed by other load is not one). The target split equalises the predicted
        finishing times (``cost_allocation``); it is taken only if it shortens the predicted slowest compute
        by at least ``deadband`` (``predicted_gain``), and approached with the same batch deadband and clamp
        as ``update``.
        """
        cfg = self.config
        n = self.allocation.size
        if not steps or any(len(b) != n or len(t) != n for b, t in steps):
            raise ValueError(f"need at least one step with {n} batches and {n} times")
        history = list(self.observations) if self.observations else [()] * n
        costs = []
        for i in range(n):
            new = tuple((int(b[i]), float(t[i])) for b, t in steps)
            old = history[i]
            if old and cfg.jump is not None:
                # A real change of speed moves every step of the window the same way; other load slows
                # single steps (one step twice as long in a window of two is not a change of speed).
                before = self.fits[i] if self.fits else fit_affine(*zip(*old))
                ratios = [t / before.seconds(b) for b, t in new]
                if min(ratios) > 1.0 + cfg.jump or max(ratios) < 1.0 - cfg.jump:
                    old = ()
            history[i] = (old + new)[-cfg.history:]
            costs.append(fit_affine(*zip(*history[i])))
        current = self.allocation.batch_sizes
        speeds = tuple(b / c.seconds(b) for b, c in zip(current, costs))
        target = cost_allocation(costs, cfg.global_batch, min_batch=cfg.min_batch).batch_sizes
        nxt = replace(self, speeds=speeds, updates=self.updates + 1, observations=tuple(history), fits=tuple(costs))
        if predicted_gain(costs, current, target) < cfg.deadband:
            return nxt  # the re-split would not shorten the predicted step by the deadband: noise, keep the split
        return nxt.moved_towards(target)

    def moved_towards(self, target: tuple[int, ...]) -> AdaptiveAllocator:
        """This allocator moved towards ``target`` within the deadband and the clamp."""
        cfg, nxt = self.config, self
        current = self.allocation.batch_sizes
        if _max_relative_change(current, target) < cfg.deadband:
            return nxt
        # Move towards the target by the largest fraction that keeps every |db_i| within the clamp;
        # a convex combination of two allocations of B is again one, so the sum stays B.
        step = Fraction(1)
        for b, t in zip(current, target):
            if t != b:
                step = min(step, max(Fraction(cfg.max_change) * b, Fraction(1)) / abs(t - b))
        if step < 1:
            target = apportion([b + step * (t - b) for b, t in zip(current, target)], cfg.global_batch, cfg.min_batch)
        return replace(nxt, allocation=Allocation(self.allocation.workers, target))

    def with_workers(self, workers: Sequence[str], profiles: Mapping[str, float] | None = None) -> AdaptiveAllocator:
        """A new membership, reallocated at once (no deadband or clamp: the old split no longer applies)."""
        speeds = membership_speeds(self.allocation.workers, self.speeds, workers, profiles)
        alloc = static_allocation(speeds, self.config.global_batch, min_batch=self.config.min_batch, workers=workers)
        return replace(self, allocation=alloc, speeds=speeds, observations=(), fits=())

    def add_worker(self, worker: str, speed: float | None = None) -> AdaptiveAllocator:
        """Append ``worker`` at the end of the ring, at ``speed`` or the current mean speed."""
        if worker in self.allocation.workers:
            raise ValueError(f"worker {worker!r} is already a member")
        return self.with_workers((*self.allocation.workers, worker), None if speed is None else {worker: speed})

    def remove_worker(self, worker: str) -> AdaptiveAllocator:
        self.allocation.rank_of(worker)
        if self.allocation.size == 1:
            raise ValueError("cannot remove the last worker")
        return self.with_workers(tuple(w for w in self.allocation.workers if w != worker))

    def replace_worker(self, old: str, new: str, speed: float | None = None) -> AdaptiveAllocator:
        """Put ``new`` in ``old``'s place in the ring; its speed is ``speed`` or the current mean."""
        rank = self.allocation.rank_of(old)
        if new in self.allocation.workers:
            raise ValueError(f"worker {new!r} is already a member")
        workers = list(self.allocation.workers)
        workers[rank] = new
        return self.with_workers(workers, None if speed is None else {new: speed})
