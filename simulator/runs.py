"""Runs of a configuration: its jobs, one policy's simulation, and every policy at once on an executor.

Each policy runs as one task (:func:`run_policy`) that builds the trace itself (a synthetic trace from its seed,
or the trace file), simulates and writes its own files, and returns what the comparison needs (its summary and
the arrays the plot draws): tasks are cheap to send to another process and their results cheap to send back.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controller.policies import make_policy
from simulator import report
from simulator.config import SimConfig
from simulator.engine import SimResult, Simulation
from simulator.placement import make_placement
from simulator.report import PolicyRun
from simulator.trace import JobSpec, TraceFormat, generate_trace, interarrival_for_load, read_job_log, read_trace

__all__ = ["Trace", "load_trace", "run_policies", "run_policy", "simulate"]


@dataclass(frozen=True)
class Trace:
    """The jobs a configuration simulates, what to call them, and how many rows of a job log were left out."""

    jobs: list[JobSpec]
    name: str
    skipped: int = 0


def load_trace(config: SimConfig) -> Trace:
    """The configuration's jobs: its trace file, else a synthetic trace at its offered load."""
    if config.trace is None:
        workload = config.workload
        if config.load:
            interarrival = interarrival_for_load(workload, config.cluster.total_workers, config.load)
            workload = dataclasses.replace(workload, mean_interarrival_s=interarrival)
        jobs = generate_trace(workload, config.seed)
        return Trace(jobs[: config.max_jobs], f"synthetic {len(jobs)} jobs, seed {config.seed}")
    if config.trace_format == TraceFormat.CSV:
        return Trace(read_trace(config.trace)[: config.max_jobs], config.trace.name)
    jobs, skipped = read_job_log(config.trace, config.trace_format, seed=config.seed, max_jobs=config.max_jobs)
    return Trace(jobs, f"{config.trace.name} ({config.trace_format})", skipped)


def simulate(config: SimConfig, policy: str, jobs: Sequence[JobSpec], progress: float | None = None) -> SimResult:
    """One policy's run of `jobs` on the configuration's cluster."""
    too_big = [j.job_id for j in jobs if j.num_workers > config.cluster.total_workers]
    if too_big:
        raise ValueError(f"{len(too_big)} job(s) need more than the cluster's {config.cluster.total_workers} workers "
                         f"(first: job {too_big[0]})")
    sim = Simulation(config.cluster, config.calibration, make_policy(policy), make_placement(config.placement),
                     data_split=config.data_split, queue=config.queue, follow_grant=config.follow_grant,
                     check=config.check, progress=progress)
    return sim.run(jobs)


_given: tuple[SimConfig, Trace] | None = None  # in a pool's process: the trace its parent loaded for a configuration


def _receive(config: SimConfig, trace: Trace) -> None:
    """A pool process's initializer: the parent's trace (inherited, not copied, where processes fork)."""
    global _given
    _given = (config, trace)


def run_policy(config: SimConfig, policy: str, *, write: bool = True, progress: float | None = None) -> PolicyRun:
    """One policy's task: the configuration's trace (the one its pool was given, else loaded), its simulation, and
    (`write`) its jobs' and timeline's CSV in the configuration's output directory; its summary records the
    CPU-seconds all that took (``cpu_s``)."""
    started = time.process_time()
    trace = _given[1] if _given is not None and _given[0] == config else load_trace(config)
    result = simulate(config, policy, trace.jobs, progress)
    if write:
        report.write_policy(config.out, result)
    summary = report.summarize(result)
    jct = np.array([j.jct_s for j in result.jobs])
    memory = np.array([(t, held) for t, held, *_ in result.timeline], dtype=float).reshape(-1, 2)
    cpu = time.process_time() - started
    return PolicyRun(policy, {**summary, "cpu_s": cpu}, jct, memory, cpu)


def run_policies(config: SimConfig, executor: concurrent.futures.Executor | None = None,
                 progress: float | None = None, trace: Trace | None = None) -> list[PolicyRun]:
    """Every policy of the configuration, each a task on `executor` (default: a process pool of
    ``config.processes`` processes, one per core when 0, given `trace` if the caller has loaded it), in the
    configuration's order."""
    if executor is None and len(config.policies) > 1:
        workers = min(len(config.policies), config.processes or os.cpu_count() or 1)
        shared = {"initializer": _receive, "initargs": (config, trace)} if trace is not None else {}
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers, **shared) as pool:
            return run_policies(config, pool, progress)
    if executor is None:
        return [run_policy(config, config.policies[0], progress=progress)]
    futures = [executor.submit(run_policy, config, name, progress=progress) for name in config.policies]
    return [f.result() for f in futures]
