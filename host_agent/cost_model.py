"""A worker's compute cost as a function of its batch, and the split that makes all workers finish together.

The seed paper's allocation assumes a step's compute is proportional to the batch (t_i(b) = b / v_i),
which holds for the emulated accelerator but not for real compute: a PyTorch step has a fixed part
(Python, dispatch, small kernels) that does not shrink with the batch. With cost ``t_i(b) = a_i + c_i b``
a proportional split gives the slow worker too many samples when ``a_i`` is large relative to ``c_i b``,
or mistakes overhead for slowness. This module owns the affine model:

- ``AffineCost``: ``a`` (seconds per step) and ``c`` (seconds per sample) of one worker;
- ``fit_affine``: a robust fit (Theil-Sen: the median of pairwise slopes, then the median intercept) of
  observed (batch, seconds) pairs, so a few steps slowed by other load do not move it; it falls back to
  the proportional model when the batches do not vary or the fit is not physical (slope <= 0, a < 0);
- ``equal_finish_shares``: the real batches summing to B with predicted finishing times a_i + c_i b_i
  equal (water-filling: a worker whose share would fall below the minimum gets the minimum);
  ``host_agent.allocation.cost_allocation`` rounds them to an ``Allocation``.

Deterministic and free of I/O, like ``host_agent.allocation``: every worker computes the same split from
the same all-gathered numbers. See docs/agent-allocation.md, "Cost model".
"""
from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["AffineCost", "CostModel", "equal_finish_shares", "fit_affine"]


class CostModel(str, enum.Enum):
    """How the allocators predict a worker's compute time from its batch."""

    PROPORTIONAL = "proportional"  # t = b / v: the paper's model; exact for the emulated accelerator
    AFFINE = "affine"  # t = a + c b: a per-step constant plus a per-sample cost (real compute)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class AffineCost:
    """Predicted compute seconds of a step of ``b`` samples: ``fixed_s + per_sample_s * b``."""

    fixed_s: float
    per_sample_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fixed_s) and self.fixed_s >= 0):
            raise ValueError(f"fixed cost must be finite and >= 0, got {self.fixed_s!r}")
        if not (math.isfinite(self.per_sample_s) and self.per_sample_s > 0):
            raise ValueError(f"per-sample cost must be finite and > 0, got {self.per_sample_s!r}")

    def seconds(self, batch: float) -> float:
        return self.fixed_s + self.per_sample_s * batch

    @classmethod
    def proportional(cls, speed: float) -> AffineCost:
        """The paper's model for a worker of ``speed`` samples/s: no fixed part."""
        return cls(0.0, 1.0 / speed)


def _proportional_fit(b: np.ndarray, t: np.ndarray) -> AffineCost:
    return AffineCost(0.0, max(float(np.median(t / b)), 1e-12))


def fit_affine(batches: Sequence[int], seconds: Sequence[float]) -> AffineCost:
    """Theil-Sen fit of ``seconds ~ a + c * batches``, clamped to a physical model (a >= 0, c > 0).

    Needs two distinct batch sizes for the slope; with one, or when the slope is not positive (noise
    larger than the batch's effect), the proportional model through the median per-sample time is
    returned. A negative intercept is clamped to 0 and the slope refitted as that proportional model.
    """
    b = np.asarray(batches, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if b.size == 0 or b.shape != t.shape:
        raise ValueError(f"need as many batches as times (at least one), got {b.size} and {t.size}")
    if (b <= 0).any() or not np.isfinite(t).all() or (t <= 0).any():
        raise ValueError("batches must be >= 1 and times finite and > 0")
    i, j = np.triu_indices(b.size, k=1)
    distinct = b[i] != b[j]
    if not distinct.any():
        return _proportional_fit(b, t)
    slope = float(np.median((t[j] - t[i])[distinct] / (b[j] - b[i])[distinct]))
    if slope <= 0:
        return _proportional_fit(b, t)
    intercept = float(np.median(t - slope * b))
    if intercept < 0:
        return _proportional_fit(b, t)
    return AffineCost(intercept, slope)


def equal_finish_shares(costs: Sequence[AffineCost], total: int, minimum: int = 1) -> tuple[float, ...]:
    """Real batches b_i >= ``minimum`` summing to ``total`` with a_i + c_i b_i equal (clamped workers aside).

    Real solution: T = (total + sum a_i/c_i) / sum 1/c_i and b_i = (T - a_i) / c_i over the workers not
    clamped; a worker whose b_i falls below ``minimum`` is fixed there and the rest re-solved. With every
    a_i = 0 the shares are proportional to the speeds 1/c_i.
    """
    if not costs:
        raise ValueError("need at least one worker's cost")
    n = len(costs)
    if isinstance(total, bool) or not isinstance(total, int) or minimum < 1 or total < n * minimum:
        raise ValueError(f"cannot give {n} workers at least {minimum} each out of {total}")
    fixed: set[int] = set()
    while True:
        free = [k for k in range(n) if k not in fixed]
        rest = total - minimum * len(fixed)
        inv = math.fsum(1.0 / costs[k].per_sample_s for k in free)
        finish = (rest + math.fsum(costs[k].fixed_s / costs[k].per_sample_s for k in free)) / inv
        share = {k: (finish - costs[k].fixed_s) / costs[k].per_sample_s for k in free}
        below = [k for k in free if share[k] < minimum]
        if not below:
            break
        fixed.update(below)  # never empties `free`: the worker with the largest share is >= rest/len(free) >= minimum
    return tuple(float(minimum) if k in fixed else share[k] for k in range(n))
