"""Data-parallel training through the agent, with equal, static or self-adaptive data allocation.

Every worker holds the same parameters, takes its slice of each global batch (``Allocation.indices``),
scales its mean gradient by b_i / B and all-reduces it through the agent, so the update is the mean
gradient of the global batch whatever the split (docs/agent-allocation.md). Allocation modes:

- ``equal``: B split evenly;
- ``static``: split from costs profiled once before training (the fastest of a few timed runs of the
  worker's device, which other load can only slow down) and all-gathered;
- ``adaptive``: ``AdaptiveAllocator`` re-splits from the compute times measured during training.

Both follow the cost model (``host_agent/cost_model.py``): ``proportional`` (the paper's: split in
proportion to speed; exact for the emulated accelerator) or ``affine`` (t = a + c b, fitted; the split
equalises predicted finishing times; the default for torch compute, whose steps have a fixed overhead).
Static with the affine model profiles two batch sizes, B/n and B/(4n).

Each step's all-reduce carries, after the gradient, the batch's loss and every worker's compute time of
the step (worker i's slot holds its time, the others add zeros), so every worker learns all speeds without
another round trip: the adaptive allocator's measurements and the per-step records (``host_agent.metrics``)
come from there.

Compute (``ComputeMode``): ``emulated`` trains the numpy MLP with an emulated accelerator whose step time
is proportional to the batch; ``torch`` trains a PyTorch CNN, really computed and scaled to the worker's
speed (``host_agent/compute.py``). Data: scikit-learn's digits (``host_agent/models.py``).
"""
from __future__ import annotations

import enum
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from host_agent.allocation import (
    AdaptiveAllocator,
    AdaptiveConfig,
    Allocation,
    cost_allocation,
    epoch_permutation,
    static_allocation,
)
from host_agent.compute import Accelerator, EmulatedAccelerator, ScaledAccelerator, SpeedSchedule
from host_agent.cost_model import AffineCost, CostModel, fit_affine
from host_agent.metrics import EvalPoint, TrainResult, time_to_target
from host_agent.models import Mlp, ModelKind, digits_split, make_dataset, make_model

__all__ = ["ALLOCATIONS", "AllocationMode", "ComputeMode", "CostModel", "Mlp", "Reducer", "TrainConfig", "TrainResult",
           "make_dataset", "model_size", "train"]


class AllocationMode(str, enum.Enum):
    EQUAL = "equal"
    STATIC = "static"
    ADAPTIVE = "adaptive"

    def __str__(self) -> str:
        return self.value


class ComputeMode(str, enum.Enum):
    """``emulated``: numpy MLP, step time = batch x per-sample cost / speed; ``torch``: PyTorch CNN, measured."""

    EMULATED = "emulated"
    TORCH = "torch"

    def __str__(self) -> str:
        return self.value

    @property
    def model(self) -> ModelKind:
        return ModelKind.MLP if self is ComputeMode.EMULATED else ModelKind.CNN


ALLOCATIONS = tuple(m.value for m in AllocationMode)


class Reducer(Protocol):
    """What training needs from an agent: ``Agent`` has these."""

    rank: int
    size: int

    def allreduce(self, array: np.ndarray) -> np.ndarray: ...

    def allgather(self, array: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class TrainConfig:
    """A training run; identical on every worker except ``speed`` and ``seed``-independent jitter.

    Args:
        allocation: equal, static or adaptive.
        compute: emulated (numpy MLP on an emulated accelerator) or torch (PyTorch CNN, measured).
        steps: global steps.
        global_batch: B, samples per step over all workers.
        lr: SGD learning rate.
        hidden: hidden units of the MLP.
        seed: initialisation and sample order.
        per_sample_s: emulated: seconds per sample at speed 1.
        speed: this worker's relative speed by step (1 = the reference device).
        jitter: emulated: relative spread of each step's compute time (0: exact).
        update_every: adaptive: steps per measurement window (a re-split after each window).
        smoothing, jump, deadband, max_change: the adaptive allocator's knobs (``AdaptiveConfig``).
        eval_every: steps between held-out evaluations (and the last step).
        target_accuracy: held-out accuracy whose first reaching gives ``time_to_target_s``.
        static_probes: static: timed probe runs; the fastest gives the speed.
        min_batch: smallest per-worker batch.
        cost_model: how static and adaptive predict compute time from the batch; None: proportional for
            emulated compute, affine for torch.
        device_slowdown: torch: how many times slower than one host core the device of speed 1 is (a
            step of CPU time t lasts t x device_slowdown / speed; ``ScaledAccelerator``).
    """

    allocation: AllocationMode = AllocationMode.EQUAL
    compute: ComputeMode = ComputeMode.EMULATED
    steps: int = 50
    global_batch: int = 240
    lr: float = 0.5
    hidden: int = 32
    seed: int = 0
    per_sample_s: float = 0.0005
    speed: SpeedSchedule = field(default_factory=SpeedSchedule)
    jitter: float = 0.0
    update_every: int = 2
    smoothing: float = 0.5
    jump: float | None = 0.5
    deadband: float = 0.05
    max_change: float = 0.5
    eval_every: int = 2
    target_accuracy: float | None = None
    static_probes: int = 3
    min_batch: int = 1
    cost_model: CostModel | None = None
    device_slowdown: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocation", AllocationMode(self.allocation))
        if self.cost_model is None:
            object.__setattr__(self, "cost_model", CostModel.PROPORTIONAL if ComputeMode(self.compute) is ComputeMode.EMULATED
                               else CostModel.AFFINE)
        object.__setattr__(self, "cost_model", CostModel(self.cost_model))
        object.__setattr__(self, "compute", ComputeMode(self.compute))
        if min(self.steps, self.global_batch, self.hidden, self.update_every, self.eval_every, self.static_probes) < 1:
            raise ValueError("steps, global_batch, hidden, update_every, eval_every and static_probes must be >= 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be finite and > 0, got {self.lr}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"target accuracy must be in (0, 1], got {self.target_accuracy}")
        # the allocator's and the accelerator's own checks, before any worker starts
        self.adaptive_config()
        EmulatedAccelerator(self.per_sample_s, self.speed, self.jitter)
        ScaledAccelerator(self.speed, self.device_slowdown)

    def adaptive_config(self) -> AdaptiveConfig:
        return AdaptiveConfig(self.global_batch, min_batch=self.min_batch, update_every=self.update_every,
                              smoothing=self.smoothing, deadband=self.deadband, max_change=self.max_change,
                              jump=self.jump, cost_model=self.cost_model)

    def accelerator(self, rank: int) -> Accelerator:
        if self.compute is ComputeMode.EMULATED:
            return EmulatedAccelerator(self.per_sample_s, self.speed, self.jitter, seed=self.seed * 1000 + rank)
        return ScaledAccelerator(self.speed, self.device_slowdown)

    def as_dict(self) -> dict:
        return {"allocation": str(self.allocation), "compute": str(self.compute), "steps": self.steps,
                "global_batch": self.global_batch, "lr": self.lr, "hidden": self.hidden, "seed": self.seed,
                "per_sample_s": self.per_sample_s, "speed": str(self.speed), "jitter": self.jitter,
                "update_every": self.update_every, "smoothing": self.smoothing, "jump": self.jump,
                "deadband": self.deadband, "max_change": self.max_change, "eval_every": self.eval_every,
                "target_accuracy": self.target_accuracy, "min_batch": self.min_batch,
                "cost_model": str(self.cost_model), "device_slowdown": self.device_slowdown}


def model_size(cfg: TrainConfig) -> int:
    """Parameters of the run's model (the all-reduce carries them, the loss and n compute times)."""
    return make_model(cfg.compute.model, hidden=cfg.hidden).size


def _static_speed(accel: Accelerator, compute: Callable[[np.ndarray], object], probe: np.ndarray, runs: int) -> float:
    accel.run(lambda: compute(probe), len(probe), 0)  # warm-up
    best = min(accel.run(lambda: compute(probe), len(probe), 0)[1] for _ in range(runs))
    return len(probe) / max(best, 1e-9)


def _static_cost(accel: Accelerator, compute: Callable[[np.ndarray], object], sizes: tuple[int, ...], runs: int) -> AffineCost:
    """The affine cost fitted to the fastest of ``runs`` timed runs at each batch size."""
    accel.run(lambda: compute(np.arange(sizes[0])), sizes[0], 0)  # warm-up
    best = [min(accel.run(lambda b=b: compute(np.arange(b)), b, 0)[1] for _ in range(runs)) for b in sizes]
    return fit_affine(sizes, [max(t, 1e-9) for t in best])


def train(agent: Reducer, cfg: TrainConfig, *,
          progress: Callable[[int, int, float, Allocation], None] | None = None) -> TrainResult:
    """Train through ``agent``; every worker ends with the same model. Rank 0 evaluates the held-out set."""
    data = digits_split()
    X, y = data.X_train, data.y_train
    model = make_model(cfg.compute.model, data.classes, cfg.hidden)
    params = model.init(cfg.seed)
    n, rank = agent.size, agent.rank
    accel = cfg.accelerator(rank)

    def compute(idx: np.ndarray) -> tuple[float, np.ndarray]:
        return model.loss_and_grad(params, X[idx], y[idx])

    adaptive: AdaptiveAllocator | None = None
    profile_start = time.perf_counter()
    if cfg.allocation is AllocationMode.EQUAL:
        alloc = static_allocation([1.0] * n, cfg.global_batch, min_batch=cfg.min_batch)
    elif cfg.allocation is AllocationMode.STATIC and cfg.cost_model is CostModel.AFFINE:
        full = max(1, cfg.global_batch // n)
        cost = _static_cost(accel, compute, tuple(sorted({max(1, full // 4), full})), cfg.static_probes)
        ac = agent.allgather(np.array([cost.fixed_s, cost.per_sample_s], dtype=np.float64))
        alloc = cost_allocation([AffineCost(float(a), float(c)) for a, c in ac], cfg.global_batch, min_batch=cfg.min_batch)
    elif cfg.allocation is AllocationMode.STATIC:
        speed = _static_speed(accel, compute, np.arange(max(1, cfg.global_batch // n)), cfg.static_probes)
        speeds = agent.allgather(np.array([speed], dtype=np.float64))[:, 0]
        alloc = static_allocation(list(speeds), cfg.global_batch, min_batch=cfg.min_batch)
    else:
        adaptive = AdaptiveAllocator.start(cfg.adaptive_config(), n)
        alloc = adaptive.allocation

    profile_seconds = time.perf_counter() - profile_start  # static: timing the device, off the training clock
    agent.allgather(np.zeros(1, dtype=np.float32))  # start together: agents start seconds apart, off the clock
    result = TrainResult(target_accuracy=cfg.target_accuracy, profile_seconds=profile_seconds)
    window_samples, window_seconds = np.zeros(n), np.zeros(n)
    window_steps: list[tuple[tuple[int, ...], np.ndarray]] = []  # affine: (batches, times) per step
    steps_per_epoch = X.shape[0] // cfg.global_batch
    snapshots: list[tuple[int, float, np.ndarray]] = []
    size = params.size
    mine = np.zeros(n, dtype=np.float32)
    perm, epoch = None, -1
    start = time.perf_counter()
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        if adaptive is not None and adaptive.due(step, steps_per_epoch) and window_seconds.all():
            if cfg.cost_model is CostModel.AFFINE:
                adaptive = adaptive.observe(window_steps)
            else:
                adaptive = adaptive.update(list(window_samples / window_seconds))
            alloc = adaptive.allocation
            window_samples[:], window_seconds[:] = 0.0, 0.0
            window_steps.clear()
        if step // steps_per_epoch != epoch:
            epoch = step // steps_per_epoch
            perm = epoch_permutation(cfg.seed, epoch, X.shape[0])
        idx = alloc.indices(perm, rank, step % steps_per_epoch)
        (loss, grad), tc = accel.run(lambda idx=idx: compute(idx), len(idx), step)
        w = np.float32(alloc.gradient_scale(rank))
        mine[:] = 0.0
        mine[rank] = tc
        t1 = time.perf_counter()
        total = agent.allreduce(np.concatenate([grad * w, np.array([loss * w], dtype=np.float32), mine]))
        t2 = time.perf_counter()
        params -= np.float32(cfg.lr) * total[:size]
        times = np.maximum(total[size + 1:].astype(np.float64), 1e-6)
        window_samples += alloc.batch_sizes
        window_seconds += times
        if adaptive is not None:
            window_steps.append((alloc.batch_sizes, times))
        result.add_step(loss=float(total[size]), batch=alloc.batch_sizes, wall=t2 - t0, compute=tc, comm=t2 - t1,
                        compute_all=times, end=t2 - start)
        if rank == 0 and ((step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1):
            snapshots.append((step, t2 - start, params.copy()))
        if progress is not None:
            progress(step + 1, cfg.steps, float(total[size]), alloc)
    result.seconds = time.perf_counter() - start
    result.compute_overruns = accel.overruns
    for step, seconds, snap in snapshots:  # off the clock
        loss, acc = model.evaluate(snap, data.X_test, data.y_test)
        result.evals.append(EvalPoint(step, (step + 1) * cfg.global_batch, seconds, loss, acc))
    if rank != 0:  # every worker holds the same parameters: any of them can say the final accuracy
        result.test_loss, result.accuracy = model.evaluate(params, data.X_test, data.y_test)
    else:
        result.test_loss, result.accuracy = result.evals[-1].loss, result.evals[-1].accuracy
    if cfg.target_accuracy is not None:
        result.time_to_target_s = time_to_target(result.evals, cfg.target_accuracy)
    result.final_params_digest = hashlib.sha256(params.tobytes()).hexdigest()[:16]
    return result
