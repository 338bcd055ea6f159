"""Job traces: the CSV format, a synthetic generator, and readers for Philly's and Helios' job logs.

Trace CSV (one header row, one job per row; docs/simulation.md has the full table):

    job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s,priority,deadline_s,slots,min_slots,weight,model,startup_s,
    startup_iterations

Required: job_id (unique int), arrival_s (seconds from trace start), num_workers, grad_bytes (gradient
bytes all-reduced per iteration), iterations, compute_s (seconds of compute per iteration: one value
for every worker, or ``;``-separated, one per worker, for a heterogeneous job). Optional, empty =
default: priority (int, 0), deadline_s (seconds after arrival by which the job should finish, none),
slots and min_slots (INA slots asked per switch; derived from the time model when empty), weight
(share weight for the weighted policy, 1), model (free-text label), startup_s (seconds after its start
before the job makes progress, holding its workers and slots: process start-up; 0), startup_iterations (all-reduces
the job runs within its start-up, not counted in iterations: a warm-up, whose packets load a shared switch; 0).
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from inaproto.config import setting
from simulator.errors import SimulatorError

__all__ = [
    "COLUMNS",
    "HELIOS_COLUMNS",
    "MODEL_ZOO",
    "REQUIRED_COLUMNS",
    "JobSpec",
    "ModelProfile",
    "SyntheticConfig",
    "TraceError",
    "TraceFormat",
    "generate_trace",
    "interarrival_for_load",
    "read_job_log",
    "read_trace",
    "write_trace",
]

COLUMNS = (
    "job_id",
    "arrival_s",
    "num_workers",
    "grad_bytes",
    "iterations",
    "compute_s",
    "priority",
    "deadline_s",
    "slots",
    "min_slots",
    "weight",
    "model",
    "startup_s",
    "startup_iterations",
)
REQUIRED_COLUMNS = COLUMNS[:6]


class TraceError(SimulatorError, ValueError):
    """A trace that cannot be used; the message names the file, the line and the field."""


@dataclass(frozen=True)
class JobSpec:
    """One training job as the trace describes it."""

    job_id: int
    arrival_s: float
    num_workers: int
    grad_bytes: int
    iterations: int
    compute_s: tuple[float, ...]  # one value for all workers, or one per worker
    priority: int = 0
    deadline_s: float | None = None  # relative to arrival
    slots: int | None = None
    min_slots: int | None = None
    weight: float = 1.0
    model: str = ""
    startup_s: float = 0.0  # after its start, no progress for this long (processes starting); holds workers and slots
    startup_iterations: int = 0  # all-reduces run within startup_s (a warm-up call): load on a shared switch only

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute_s", tuple(float(c) for c in self.compute_s))  # numpy floats -> float
        if self.arrival_s < 0 or not math.isfinite(self.arrival_s):
            raise ValueError(f"job {self.job_id}: arrival_s must be a finite number >= 0")
        if self.num_workers < 1:
            raise ValueError(f"job {self.job_id}: num_workers must be >= 1")
        if self.grad_bytes < 0:
            raise ValueError(f"job {self.job_id}: grad_bytes must be >= 0")
        if self.iterations < 1:
            raise ValueError(f"job {self.job_id}: iterations must be >= 1")
        if len(self.compute_s) not in (1, self.num_workers):
            raise ValueError(
                f"job {self.job_id}: compute_s needs 1 value or one per worker ({self.num_workers}), got {len(self.compute_s)}"
            )
        if any(not math.isfinite(c) or c < 0 for c in self.compute_s):
            raise ValueError(f"job {self.job_id}: compute_s values must be finite and >= 0")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"job {self.job_id}: deadline_s must be > 0 when given")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"job {self.job_id}: slots must be >= 1 when given")
        if self.min_slots is not None and not 1 <= self.min_slots <= (self.slots or self.min_slots):
            raise ValueError(f"job {self.job_id}: min_slots must be in [1, slots] when given")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"job {self.job_id}: weight must be > 0")
        if not (math.isfinite(self.startup_s) and self.startup_s >= 0):
            raise ValueError(f"job {self.job_id}: startup_s must be a finite number >= 0")
        if self.startup_iterations < 0:
            raise ValueError(f"job {self.job_id}: startup_iterations must be >= 0")

    def per_worker_compute(self) -> tuple[float, ...]:
        return self.compute_s * self.num_workers if len(self.compute_s) == 1 else self.compute_s


# --- CSV ----------------------------------------------------------------------------------------------


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ";".join(repr(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_trace(path: str | Path, jobs: Iterable[JobSpec]) -> None:
    """Write jobs in the trace CSV format; floats are written exactly, so reading gives the same jobs."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for job in jobs:
            writer.writerow([_fmt(getattr(job, name)) for name in COLUMNS])


def read_trace(path: str | Path) -> list[JobSpec]:
    """Read a trace CSV; any problem raises TraceError naming the line and column."""
    path = Path(path)
    try:
        with open(path, newline="") as fh:
            return _read_rows(csv.DictReader(fh), path)
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None


def _read_rows(reader: csv.DictReader, path: Path) -> list[JobSpec]:
    """The jobs of a trace CSV's rows, its header checked first."""
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)} (required: {', '.join(REQUIRED_COLUMNS)})")
    unknown = [c for c in header if c not in COLUMNS]
    if unknown:
        raise TraceError(f"{path}: unknown column(s) {', '.join(unknown)}; valid: {', '.join(COLUMNS)}")
    jobs: list[JobSpec] = []
    seen: set[int] = set()
    for row in reader:
        line = reader.line_num
        try:
            job = _parse_row(row)
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{path}:{line}: {exc}") from None
        if job.job_id in seen:
            raise TraceError(f"{path}:{line}: duplicate job_id {job.job_id}")
        seen.add(job.job_id)
        jobs.append(job)
    return jobs


def _parse_row(row: dict[str, str | None]) -> JobSpec:
    def get(name: str) -> str:
        value = row.get(name)
        return "" if value is None else value.strip()

    def need(name: str, conv):
        text = get(name)
        if text == "":
            raise ValueError(f"column {name!r} is empty")
        try:
            return conv(text)
        except ValueError:
            raise ValueError(f"column {name!r}: cannot read {text!r} as {conv.__name__}") from None

    def opt(name: str, conv):
        return need(name, conv) if get(name) != "" else None

    compute = tuple(float(part) for part in need("compute_s", str).split(";"))
    weight = opt("weight", float)
    return JobSpec(
        job_id=need("job_id", int),
        arrival_s=need("arrival_s", float),
        num_workers=need("num_workers", int),
        grad_bytes=need("grad_bytes", int),
        iterations=need("iterations", int),
        compute_s=compute,
        priority=opt("priority", int) or 0,
        deadline_s=opt("deadline_s", float),
        slots=opt("slots", int),
        min_slots=opt("min_slots", int),
        weight=1.0 if weight is None else weight,
        model=get("model"),
        startup_s=opt("startup_s", float) or 0.0,
        startup_iterations=opt("startup_iterations", int) or 0,
    )


# --- synthetic traces -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelProfile:
    """A DNN as the simulator sees it: fp32 gradient bytes per iteration, compute seconds per iteration."""

    grad_bytes: int
    compute_s: float


# Parameter counts are the published model sizes (x 4 bytes, fp32 gradients); compute times are rough
# per-iteration figures for one V100-class GPU at a typical per-GPU batch, to be replaced by measured ones.
MODEL_ZOO: dict[str, ModelProfile] = {
    "resnet50": ModelProfile(grad_bytes=25_557_032 * 4, compute_s=0.10),  # batch 32 images
    "vgg16": ModelProfile(grad_bytes=138_357_544 * 4, compute_s=0.15),  # batch 32 images
    "bert-base": ModelProfile(grad_bytes=110_000_000 * 4, compute_s=0.20),  # batch 16 x 128 tokens
    "bert-large": ModelProfile(grad_bytes=340_000_000 * 4, compute_s=0.50),  # batch 8 x 128 tokens
    "gpt2": ModelProfile(grad_bytes=124_000_000 * 4, compute_s=0.25),  # batch 8 x 1024 tokens
}


@dataclass(frozen=True)
class SyntheticConfig:
    """Distributions of the synthetic workload (the ``[workload]`` table of ina-sim's configuration).

    Arrivals are a Poisson process (exponential inter-arrival times); sizes, models and priorities are
    drawn from the discrete distributions below, iterations from a clipped log-normal.
    """

    num_jobs: int = setting(1000, "jobs to draw")
    mean_interarrival_s: float = setting(30.0, "mean of the exponential inter-arrival times (s)")
    sizes: tuple[tuple[int, float], ...] = setting(
        ((1, 0.10), (2, 0.15), (4, 0.25), (8, 0.30), (16, 0.12), (32, 0.08)),
        "workers per job and their probabilities: mostly small jobs, a tail of multi-rack ones (Philly-like)")
    models: tuple[tuple[str, float], ...] = setting(
        (("resnet50", 0.30), ("vgg16", 0.20), ("bert-base", 0.25), ("bert-large", 0.10), ("gpt2", 0.15)),
        "models (simulator.trace.MODEL_ZOO) and their probabilities")
    iterations_median: float = setting(3000.0, "median iterations per job (log-normal)")
    iterations_sigma: float = setting(1.0, "sigma of the iterations' log-normal: a heavy tail of long jobs")
    iterations_min: int = setting(100, "fewest iterations (the log-normal is clipped)")
    iterations_max: int = setting(100_000, "most iterations")
    priorities: tuple[tuple[int, float], ...] = setting(((0, 0.7), (1, 0.2), (2, 0.1)), "priorities and their probabilities")
    deadline_fraction: float = setting(0.3, "share of jobs with a deadline")
    deadline_slack: tuple[float, float] = setting(
        (1.5, 4.0), "a deadline is slack x iterations x compute, slack ~ U(lo, hi)")
    hetero: float = setting(0.0, "worker heterogeneity h: worker i computes in compute x (1 + h U(0, 1))")

    def __post_init__(self) -> None:
        if self.num_jobs < 0:
            raise ValueError("num_jobs must be >= 0")
        if not self.mean_interarrival_s > 0:
            raise ValueError("mean_interarrival_s must be > 0")
        for name in ("sizes", "models", "priorities"):
            dist = getattr(self, name)
            if not dist or any(p < 0 for _, p in dist) or sum(p for _, p in dist) <= 0:
                raise ValueError(f"{name} must be a non-empty distribution with non-negative probabilities")
        unknown = [m for m, _ in self.models if m not in MODEL_ZOO]
        if unknown:
            raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODEL_ZOO)}")
        if any(n < 1 for n, _ in self.sizes):
            raise ValueError("job sizes must be >= 1 worker")
        if not 0 <= self.deadline_fraction <= 1:
            raise ValueError("deadline_fraction must be in [0, 1]")
        lo, hi = self.deadline_slack
        if not 0 < lo <= hi:
            raise ValueError("deadline_slack must be (lo, hi) with 0 < lo <= hi")
        if self.hetero < 0:
            raise ValueError("hetero must be >= 0")
        if not 1 <= self.iterations_min <= self.iterations_max:
            raise ValueError("need 1 <= iterations_min <= iterations_max")


def _normalised(dist: Sequence[tuple[object, float]]) -> tuple[list, np.ndarray]:
    values = [v for v, _ in dist]
    probs = np.array([p for _, p in dist], dtype=float)
    return values, probs / probs.sum()


def interarrival_for_load(cfg: SyntheticConfig, total_workers: int, load: float) -> float:
    """Mean inter-arrival time that offers `load` x the cluster's workers, counting compute time only.

    Offered work per job is E[workers] x E[iterations] x E[compute] (independent draws; the log-normal
    mean median*exp(sigma^2/2) ignores clipping), so this is approximate: communication adds to it.
    """
    if not load > 0:
        raise ValueError("load must be > 0")
    sizes, p_size = _normalised(cfg.sizes)
    models, p_model = _normalised(cfg.models)
    mean_workers = float(np.dot(sizes, p_size))
    mean_compute = float(np.dot([MODEL_ZOO[m].compute_s for m in models], p_model)) * (1 + cfg.hetero / 2)
    mean_iters = cfg.iterations_median * math.exp(cfg.iterations_sigma**2 / 2)
    return mean_workers * mean_iters * mean_compute / (load * total_workers)


def generate_trace(cfg: SyntheticConfig, seed: int) -> list[JobSpec]:
    """Draw a synthetic trace; the same config and seed give the same jobs (numpy PCG64)."""
    rng = np.random.default_rng(seed)
    sizes, p_size = _normalised(cfg.sizes)
    models, p_model = _normalised(cfg.models)
    prios, p_prio = _normalised(cfg.priorities)
    n = cfg.num_jobs
    arrivals = np.cumsum(rng.exponential(cfg.mean_interarrival_s, n))
    size_idx = rng.choice(len(sizes), n, p=p_size)
    model_idx = rng.choice(len(models), n, p=p_model)
    prio_idx = rng.choice(len(prios), n, p=p_prio)
    iters = np.clip(
        np.rint(rng.lognormal(math.log(cfg.iterations_median), cfg.iterations_sigma, n)),
        cfg.iterations_min,
        cfg.iterations_max,
    )
    has_deadline = rng.random(n) < cfg.deadline_fraction
    slack = rng.uniform(*cfg.deadline_slack, n)
    jobs = []
    for i in range(n):
        workers = int(sizes[size_idx[i]])
        profile = MODEL_ZOO[models[model_idx[i]]]
        if cfg.hetero > 0:
            compute = tuple(round(profile.compute_s * (1 + cfg.hetero * float(u)), 6) for u in rng.random(workers))
        else:
            compute = (profile.compute_s,)
        iterations = int(iters[i])
        deadline = None
        if has_deadline[i]:
            deadline = round(float(slack[i]) * iterations * max(compute), 3)
        jobs.append(
            JobSpec(
                job_id=i,
                arrival_s=round(float(arrivals[i]), 3),
                num_workers=workers,
                grad_bytes=profile.grad_bytes,
                iterations=iterations,
                compute_s=compute,
                priority=int(prios[prio_idx[i]]),
                deadline_s=deadline,
                model=models[model_idx[i]],
            )
        )
    return jobs


# --- Philly and Helios job logs ------------------------------------------------------------------------------
# Microsoft Philly's cluster_job_log (msr-fiddle/philly-traces, README "Schema"): a JSON list of jobs, each with
# "jobid", "status", "vc", "user", "submitted_time" and "attempts", a list of {"start_time", "end_time", "detail":
# [{"ip", "gpus": [...]}]}; times "YYYY-mm-dd HH:MM:SS"; a job may have no attempt, an attempt no start or end time
# (null or "None"). SenseTime Helios' cluster_log.csv (S-Lab-System-Group/HeliosData, README "Schema"): columns
# job_id, user, vc, gpu_num, cpu_num, node_num, state, submit_time, start_time, end_time, duration (seconds, end
# less start), queue; CPU-only jobs have gpu_num 0.


class TraceFormat(StrEnum):
    CSV = "csv"  # the simulator's own trace CSV (this module's docstring)
    PHILLY = "philly"  # Microsoft Philly's cluster_job_log (JSON)
    HELIOS = "helios"  # SenseTime Helios' cluster_log.csv


HELIOS_COLUMNS = ("job_id", "gpu_num", "submit_time", "duration")  # what the reader uses of cluster_log.csv


@dataclass(frozen=True)
class _LogJob:
    submit: float
    gpus: int
    duration: float


def _timestamp(text: str) -> float:
    """A log's 'YYYY-mm-dd HH:MM:SS' as seconds (the zone does not matter: only differences are used)."""
    return dt.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()


def _philly_job(job: dict) -> _LogJob | None:
    """A Philly job: GPUs the most any of its attempts held, run time the sum of its attempts with both times."""
    duration, gpus = 0.0, 0
    for attempt in job.get("attempts") or []:
        start, end = attempt.get("start_time"), attempt.get("end_time")
        if start in (None, "None") or end in (None, "None"):
            continue
        duration += _timestamp(end) - _timestamp(start)
        gpus = max(gpus, sum(len(machine.get("gpus") or []) for machine in attempt.get("detail") or []))
    if gpus < 1 or duration <= 0:
        return None
    return _LogJob(_timestamp(job["submitted_time"]), gpus, duration)


def _philly_jobs(path: Path) -> tuple[list[_LogJob], int]:
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON list of jobs (Philly's cluster_job_log)")
    out, skipped = [], 0
    for k, job in enumerate(data):
        try:
            entry = _philly_job(job)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TraceError(f"{path}: job {k}: not a Philly job ({type(exc).__name__}: {exc})") from None
        if entry is None:
            skipped += 1
        else:
            out.append(entry)
    return out, skipped


def _helios_jobs(path: Path) -> tuple[list[_LogJob], int]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in HELIOS_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)} of Helios' cluster_log.csv")
        out, skipped = [], 0
        for row in reader:
            try:
                entry = _LogJob(_timestamp(row["submit_time"]), int(row["gpu_num"]), float(row["duration"] or 0))
            except ValueError as exc:
                raise TraceError(f"{path}:{reader.line_num}: {exc}") from None
            if entry.gpus < 1 or not entry.duration > 0:
                skipped += 1
            else:
                out.append(entry)
    return out, skipped


def read_job_log(path: str | Path, fmt: TraceFormat, *, seed: int = 0,
                 max_jobs: int | None = None) -> tuple[list[JobSpec], int]:
    """A Philly or Helios job log as a trace; returns (jobs, rows skipped).

    Logs give submit time, GPU count and run time only. Each job becomes num_workers = GPUs, a model
    drawn (seeded) from the synthetic defaults' mix, and iterations = run time / that model's compute
    time, so it runs about as long as it did when communication is cheap. Arrival times are relative
    to the first submission. Jobs without GPUs or without a run time are skipped and counted.
    """
    path = Path(path)
    try:
        log, skipped = _philly_jobs(path) if fmt == TraceFormat.PHILLY else _helios_jobs(path)
    except OSError as exc:
        raise TraceError(f"cannot read job log {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    log.sort(key=lambda j: j.submit)
    log = log[:max_jobs]
    if not log:
        return [], skipped
    rng = np.random.default_rng(seed)
    models, p_model = _normalised(SyntheticConfig().models)
    picks = rng.choice(len(models), len(log), p=p_model)
    t0 = log[0].submit
    jobs = []
    for i, (entry, pick) in enumerate(zip(log, picks)):
        profile = MODEL_ZOO[models[pick]]
        jobs.append(JobSpec(job_id=i, arrival_s=round(entry.submit - t0, 3), num_workers=entry.gpus,
                            grad_bytes=profile.grad_bytes, iterations=max(1, round(entry.duration / profile.compute_s)),
                            compute_s=(profile.compute_s,), model=models[pick]))
    return jobs, skipped
