"""How long a worker's compute takes: an emulated accelerator, or measured compute scaled to a speed.

The testbed's cores are identical and shared (2 cores, many workers), so a worker's speed is emulated.
Two ways, one interface (``Accelerator.run(fn, batch, step)`` runs ``fn`` and returns its result and the
compute seconds of the step):

- ``EmulatedAccelerator``: a step's compute takes ``batch x per_sample_s / speed(step)`` (times a seeded
  jitter factor if asked). The real work (the numpy gradient) runs first; the worker then *sleeps* until
  that deadline. Sleeping leaves the host CPU to the others, like a busy accelerator, so the speeds are
  exact and repeatable on a busy machine. If the real work alone takes longer, the step takes that long
  (``overruns`` counts it: the emulation no longer holds; make ``per_sample_s`` larger).
- ``ScaledAccelerator``: real compute (PyTorch), measured as the CPU time of the computing thread
  (``time.thread_time``: one thread per worker), not as wall time: with several workers on 2 cores the
  wall time of the same work varies with the other workers' load, its CPU time hardly. A step of CPU
  time t on a worker of speed v, whose device at speed 1 is ``slowdown`` times slower than a host core,
  takes t x slowdown / v on its device: the worker sleeps to that deadline (measured from the step's
  start), and that is the compute time it reports. Its time is not proportional to the
  batch (a per-step overhead), which is what real compute looks like (``host_agent/cost_model.py``).

``SpeedSchedule`` gives a worker's speed at each step: a constant, or the straggler's drop and recovery.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

__all__ = ["Accelerator", "EmulatedAccelerator", "ScaledAccelerator", "SpeedSchedule"]

T = TypeVar("T")


@dataclass(frozen=True)
class SpeedSchedule:
    """A worker's relative speed by step: ``base`` until the first change, then each ``(step, speed)`` in turn.

    ``SpeedSchedule(1.0, ((30, 1/3), (60, 1.0)))`` is the straggler: full speed, a third of it from
    step 30, full speed again from step 60.
    """

    base: float = 1.0
    changes: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "changes", tuple((int(s), float(v)) for s, v in self.changes))
        for v in (self.base, *(v for _, v in self.changes)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"speeds must be finite and > 0, got {v!r}")
        steps = [s for s, _ in self.changes]
        if any(s < 0 for s in steps) or steps != sorted(steps) or len(set(steps)) != len(steps):
            raise ValueError(f"speed changes need distinct steps >= 0 in increasing order, got {steps}")

    def at(self, step: int) -> float:
        speed = self.base
        for s, v in self.changes:
            if step >= s:
                speed = v
        return speed

    @classmethod
    def parse(cls, text: str) -> SpeedSchedule:
        """``"1"``, or ``"1,30:0.333,60:1"``: the base speed, then STEP:SPEED changes."""
        parts = [p for p in text.split(",") if p.strip()]
        if not parts:
            raise ValueError("empty speed schedule")
        try:
            base = float(parts[0])
            changes = tuple((int(s), float(v)) for s, v in (p.split(":") for p in parts[1:]))
        except ValueError:
            raise ValueError(f"expected SPEED[,STEP:SPEED...], e.g. 1,30:0.333,60:1, got {text!r}") from None
        return cls(base, changes)

    def __str__(self) -> str:
        return ",".join([f"{self.base:g}", *(f"{s}:{v:g}" for s, v in self.changes)])


class Accelerator(Protocol):
    """Runs a step's compute and says how long it took (seconds of this worker's device)."""

    overruns: int

    def run(self, fn: Callable[[], T], batch: int, step: int) -> tuple[T, float]: ...


@dataclass
class EmulatedAccelerator:
    """Compute time = batch x ``per_sample_s`` / speed(step) x jitter, reached by sleeping to a deadline.

    Args:
        per_sample_s: seconds per sample at speed 1.
        schedule: the worker's speed by step.
        jitter: relative standard deviation of a Gaussian factor on each step's time (0: none), clipped
            to [0.5, 1.5]; seeded, so a run is repeatable.
        seed: the jitter's seed (give each worker its own).
    """

    per_sample_s: float
    schedule: SpeedSchedule = field(default_factory=SpeedSchedule)
    jitter: float = 0.0
    seed: int = 0
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    overruns: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.per_sample_s) and self.per_sample_s > 0):
            raise ValueError(f"per_sample_s must be finite and > 0, got {self.per_sample_s!r}")
        if not 0.0 <= self.jitter < 0.5:
            raise ValueError(f"jitter must be in [0, 0.5), got {self.jitter!r}")
        self._rng = np.random.default_rng([self.seed, 7])

    def seconds(self, batch: int, step: int) -> float:
        """The emulated compute time of a batch at a step (draws the step's jitter)."""
        t = batch * self.per_sample_s / self.schedule.at(step)
        if self.jitter:
            t *= float(np.clip(1.0 + self.jitter * self._rng.standard_normal(), 0.5, 1.5))
        return t

    def run(self, fn: Callable[[], T], batch: int, step: int) -> tuple[T, float]:
        """Run ``fn``, sleep to the step's deadline; the compute time is the device's, not the host's.

        A busy host wakes the sleeper late; that lateness is the host's scheduling, not the emulated device's
        speed, so the step reports the emulated time (what an accelerator's timer would), unless the real work
        itself overran it.
        """
        start = self.clock()
        emulated = self.seconds(batch, step)
        deadline = start + emulated
        result = fn()
        now = self.clock()
        if now > deadline:
            self.overruns += 1
            return result, now - start
        while now < deadline:  # sleep() may wake early: loop to the deadline, never spin
            self.sleep(deadline - now)
            now = self.clock()
        return result, emulated


@dataclass
class ScaledAccelerator:
    """Real compute of CPU time t on a device ``slowdown / speed`` times slower than a host core: t x that.

    ``slowdown`` (>= 1) is how much slower the device of speed 1 is than one host core. At 1 (the
    fastest worker computes at host speed) the fastest workers' steps last their *wall* time, which on a
    shared machine is 1-3x their CPU time, while a slower worker's sleep hides its own contention: the
    split the allocators compute from CPU times is then not the one that balances wall times. With every
    device slower than the host by more than the contention (experiment 2: 10), every worker sleeps to its
    deadline and the device, not the host's scheduler, sets the pace. ``overruns`` counts the steps whose
    wall time still exceeded the device time (the emulation did not hold), on devices slower than the host.
    """

    schedule: SpeedSchedule = field(default_factory=SpeedSchedule)
    slowdown: float = 1.0
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    cpu_clock: Callable[[], float] = field(default=time.thread_time, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    overruns: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.slowdown) and self.slowdown >= 1.0):
            raise ValueError(f"device slowdown must be finite and >= 1, got {self.slowdown!r}")

    def run(self, fn: Callable[[], T], batch: int, step: int) -> tuple[T, float]:
        start, cpu_start = self.clock(), self.cpu_clock()
        result = fn()
        factor = self.slowdown / self.schedule.at(step)
        device = (self.cpu_clock() - cpu_start) * factor
        deadline = start + device
        now = self.clock()
        if now > deadline and factor > 1.0:
            self.overruns += 1
        while now < deadline:
            self.sleep(deadline - now)
            now = self.clock()
        return result, device


def schedules_for(speeds: Sequence[float]) -> list[SpeedSchedule]:
    """Constant schedules, one per worker."""
    return [SpeedSchedule(float(v)) for v in speeds]
