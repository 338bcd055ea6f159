"""What a training run measures, step by step: wall, compute and all-reduce time, batch, held-out accuracy.

Measured, never estimated: each step's wall time is the worker's clock from the start of its compute to
the end of its all-reduce; the compute time is what the worker's (emulated or scaled) device took; the
rest of the step is the all-reduce, which includes waiting for the slowest worker. Every worker also
learns every worker's compute time of the step (it rides on the gradient's all-reduce), so the wait of
worker i is estimated without clocks shared between hosts: ``max_j compute_j - compute_i``.

Held-out loss and accuracy are evaluated every ``eval_every`` steps on a snapshot of the parameters,
*after* training (off the clock), so evaluation neither slows the run nor shifts the time to target.
``time_to_target`` is the training wall time at the end of the first evaluated step whose held-out
accuracy reaches the target.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["EvalPoint", "TrainResult", "time_to_target"]


@dataclass(frozen=True)
class EvalPoint:
    """Held-out loss and accuracy after ``step + 1`` steps (``samples`` seen, ``seconds`` of training)."""

    step: int
    samples: int
    seconds: float
    loss: float
    accuracy: float


@dataclass
class TrainResult:
    """One worker's record of a run (JSON keys are stable: docs/experiments.md lists them).

    Per step (lists of equal length): ``losses`` (global training loss), ``batch_sizes`` (the
    allocation in force), ``step_wall_s``, ``step_compute_s``, ``step_comm_s`` (this worker),
    ``step_compute_all_s`` (every worker's compute time, rank order), ``step_end_s`` (training clock at
    the end of the step). ``evals``: held-out points. Totals: ``seconds`` (training wall time),
    ``compute_seconds``, ``comm_seconds``; ``accuracy``/``test_loss``: held-out, after the last step;
    ``profile_seconds``: time spent before the training clock starts choosing the split (static: timing
    the device), which ``seconds`` and ``time_to_target_s`` do not include.
    """

    losses: list[float] = field(default_factory=list)
    batch_sizes: list[list[int]] = field(default_factory=list)
    step_wall_s: list[float] = field(default_factory=list)
    step_compute_s: list[float] = field(default_factory=list)
    step_comm_s: list[float] = field(default_factory=list)
    step_compute_all_s: list[list[float]] = field(default_factory=list)
    step_end_s: list[float] = field(default_factory=list)
    evals: list[EvalPoint] = field(default_factory=list)
    accuracy: float = 0.0
    test_loss: float = 0.0
    seconds: float = 0.0
    compute_seconds: float = 0.0
    comm_seconds: float = 0.0
    compute_overruns: int = 0
    profile_seconds: float = 0.0
    target_accuracy: float | None = None
    time_to_target_s: float | None = None
    final_params_digest: str = ""

    def add_step(self, *, loss: float, batch: Sequence[int], wall: float, compute: float, comm: float,
                 compute_all: Sequence[float], end: float) -> None:
        self.losses.append(float(loss))
        self.batch_sizes.append([int(b) for b in batch])
        self.step_wall_s.append(wall)
        self.step_compute_s.append(compute)
        self.step_comm_s.append(comm)
        self.step_compute_all_s.append([float(t) for t in compute_all])
        self.step_end_s.append(end)
        self.compute_seconds += compute
        self.comm_seconds += comm

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_to_target(evals: Sequence[EvalPoint | dict], target: float) -> float | None:
    """Training seconds at the first evaluation whose held-out accuracy is >= ``target``; None if never."""
    for e in evals:
        acc, sec = (e.accuracy, e.seconds) if isinstance(e, EvalPoint) else (e["accuracy"], e["seconds"])
        if acc >= target:
            return float(sec)
    return None
