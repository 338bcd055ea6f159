"""Data-parallel training through the agent: a small numpy MLP, with equal, static or adaptive data allocation.

Every worker holds the same parameters, takes its slice of each global batch (``Allocation.indices``),
scales its mean gradient by b_i / B and all-reduces it through the agent, so the update is the mean
gradient of the global batch whatever the split (docs/agent-allocation.md). Allocation modes:

- ``equal``: B split evenly;
- ``static``: split in proportion to speeds profiled once before training (the fastest of 7 timed
  runs, which other load can only slow down) and all-gathered;
- ``adaptive``: ``AdaptiveAllocator`` re-splits from the compute speeds measured during training.

The data set is synthetic and built from a seed (``make_dataset``): 10 Gaussian classes in 64
dimensions, the shape of scikit-learn's digits, so the package needs no download and no extra
dependency. ``ina-agent train`` runs this; ``examples/`` has the PyTorch version.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

import numpy as np

from host_agent.allocation import (
    AdaptiveAllocator,
    AdaptiveConfig,
    Allocation,
    ComputeMeter,
    SlowdownCompute,
    epoch_permutation,
    static_allocation,
)

__all__ = ["ALLOCATIONS", "Mlp", "TrainConfig", "TrainResult", "Reducer", "make_dataset", "train"]

ALLOCATIONS = ("equal", "static", "adaptive")


class Reducer(Protocol):
    """What training needs from an agent: ``Agent`` has these."""

    rank: int
    size: int

    def allreduce(self, array: np.ndarray) -> np.ndarray: ...

    def allgather(self, array: np.ndarray) -> np.ndarray: ...


def make_dataset(samples: int = 1797, features: int = 64, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 [samples, features], y int64): Gaussian clusters around random class centres."""
    if samples < classes or features < 1 or classes < 2:
        raise ValueError(f"need samples >= classes >= 2 and features >= 1, got {samples}, {features}, {classes}")
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, size=(classes, features))
    y = np.arange(samples) % classes
    rng.shuffle(y)
    X = centres[y] + rng.normal(0.0, 4.0, size=(samples, features))
    return X.astype(np.float32), y.astype(np.int64)


class Mlp:
    """One hidden tanh layer and a softmax output; parameters in one flat float32 vector."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        self.shapes = [(features, hidden), (hidden,), (hidden, classes), (classes,)]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.size = sum(self.sizes)

    def init(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        parts = []
        for shape in self.shapes:
            fan_in = shape[0] if len(shape) == 2 else 1
            parts.append((rng.normal(0, 1 / math.sqrt(fan_in), size=shape) if len(shape) == 2 else np.zeros(shape)).ravel())
        return np.concatenate(parts).astype(np.float32)

    def _unpack(self, params: np.ndarray) -> list[np.ndarray]:
        out, off = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            out.append(params[off : off + size].reshape(shape))
            off += size
        return out

    def logits(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        W1, b1, W2, b2 = self._unpack(params)
        return np.tanh(X @ W1 + b1) @ W2 + b2

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over the batch and its gradient (float32, flat)."""
        W1, b1, W2, b2 = self._unpack(params)
        h = np.tanh(X @ W1 + b1)
        z = h @ W2 + b2
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        n = X.shape[0]
        loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
        dz = p
        dz[np.arange(n), y] -= 1.0
        dz /= n
        dW2 = h.T @ dz
        db2 = dz.sum(axis=0)
        dh = (dz @ W2.T) * (1.0 - h * h)
        dW1 = X.T @ dh
        db1 = dh.sum(axis=0)
        return loss, np.concatenate([dW1.ravel(), db1, dW2.ravel(), db2]).astype(np.float32)

    def accuracy(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        return float((self.logits(params, X).argmax(axis=1) == y).mean())


@dataclass(frozen=True)
class TrainConfig:
    """A training run; identical on every worker except ``slowdown``.

    Args:
        allocation: ``equal``, ``static`` or ``adaptive``.
        steps: global steps.
        global_batch: B, samples per step over all workers.
        lr: SGD learning rate.
        hidden: hidden units of the MLP.
        samples: size of the synthetic data set.
        seed: data, initialisation and sample order.
        update_every: adaptive: steps between re-allocations.
        slowdown: this worker's emulated slowness (compute takes ``slowdown`` times longer).
        slowdown_at: ``(step, factor)``: from that step on, this worker's slowdown is ``factor`` (a
            mid-run speed change, which adaptive allocation should follow and static cannot).
        min_batch: smallest per-worker batch.
    """

    allocation: str = "equal"
    steps: int = 50
    global_batch: int = 64
    lr: float = 0.5
    hidden: int = 32
    samples: int = 1797
    seed: int = 0
    update_every: int = 10
    slowdown: float = 1.0
    slowdown_at: tuple[int, float] | None = None
    min_batch: int = 1

    def __post_init__(self) -> None:
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {', '.join(ALLOCATIONS)}, got {self.allocation!r}")
        if self.steps < 1 or self.global_batch < 1 or self.hidden < 1 or self.update_every < 1:
            raise ValueError("steps, global_batch, hidden and update_every must be >= 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be finite and > 0, got {self.lr}")
        if self.slowdown_at is not None and (self.slowdown_at[0] < 0 or not self.slowdown_at[1] >= 1):
            raise ValueError(f"slowdown_at must be (step >= 0, factor >= 1), got {self.slowdown_at}")
        if self.samples < self.global_batch:
            raise ValueError(f"samples ({self.samples}) must be at least one global batch ({self.global_batch})")


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)  # global mean loss of each step
    batch_sizes: list[list[int]] = field(default_factory=list)  # allocation in force at each step
    accuracy: float = 0.0
    seconds: float = 0.0
    compute_seconds: float = 0.0
    comm_seconds: float = 0.0
    final_params_digest: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _timed(fn: Callable[[np.ndarray], object], arg: np.ndarray) -> float:
    start = time.perf_counter()
    fn(arg)
    return max(time.perf_counter() - start, 1e-9)


def train(agent: Reducer, cfg: TrainConfig, *, progress: Callable[[int, int, float, Allocation], None] | None = None) -> TrainResult:
    """Train the MLP on the synthetic data set through ``agent``; every worker returns the same model."""
    X, y = make_dataset(cfg.samples, seed=cfg.seed)
    model = Mlp(X.shape[1], cfg.hidden, int(y.max()) + 1)
    params = model.init(cfg.seed)
    n, rank = agent.size, agent.rank
    slow = SlowdownCompute(cfg.slowdown)

    def compute(idx: np.ndarray) -> tuple[float, np.ndarray]:
        return slow(model.loss_and_grad, params, X[idx], y[idx])

    adaptive: AdaptiveAllocator | None = None
    if cfg.allocation == "equal":
        alloc = static_allocation([1.0] * n, cfg.global_batch, min_batch=cfg.min_batch)
    elif cfg.allocation == "static":
        probe = np.arange(max(1, cfg.global_batch // n))
        compute(probe)  # warm-up
        best = min(_timed(compute, probe) for _ in range(7))  # the minimum: robust to interference
        speeds = agent.allgather(np.array([len(probe) / best], dtype=np.float64))[:, 0]
        alloc = static_allocation(list(speeds), cfg.global_batch, min_batch=cfg.min_batch)
    else:
        adaptive = AdaptiveAllocator.start(
            AdaptiveConfig(cfg.global_batch, min_batch=cfg.min_batch, update_every=cfg.update_every), n)
        alloc = adaptive.allocation

    meter = ComputeMeter()
    result = TrainResult()
    steps_per_epoch = X.shape[0] // cfg.global_batch
    start = time.perf_counter()
    perm, epoch = None, -1
    for step in range(cfg.steps):
        if cfg.slowdown_at is not None and step == cfg.slowdown_at[0]:
            slow = SlowdownCompute(cfg.slowdown_at[1])  # compute() looks it up at every call
        if adaptive is not None and adaptive.due(step, steps_per_epoch) and meter.samples:
            measured = agent.allgather(np.array([meter.take()], dtype=np.float64))[:, 0]
            adaptive = adaptive.update(list(measured))
            alloc = adaptive.allocation
        if step // steps_per_epoch != epoch:
            epoch = step // steps_per_epoch
            perm = epoch_permutation(cfg.seed, epoch, X.shape[0])
        idx = alloc.indices(perm, rank, step % steps_per_epoch)
        t0 = time.perf_counter()
        with meter.measure(len(idx)):
            loss, grad = compute(idx)
        t1 = time.perf_counter()
        w = np.float32(alloc.gradient_scale(rank))
        total = agent.allreduce(np.concatenate([grad * w, np.array([loss * w], dtype=np.float32)]))
        t2 = time.perf_counter()
        params -= np.float32(cfg.lr) * total[:-1]
        result.compute_seconds += t1 - t0
        result.comm_seconds += t2 - t1
        result.losses.append(float(total[-1]))
        result.batch_sizes.append(list(alloc.batch_sizes))
        if progress is not None:
            progress(step + 1, cfg.steps, float(total[-1]), alloc)
    result.seconds = time.perf_counter() - start
    result.accuracy = model.accuracy(params, X, y)
    result.final_params_digest = hashlib.sha256(params.tobytes()).hexdigest()[:16]
    return result
