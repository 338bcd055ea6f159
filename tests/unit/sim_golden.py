"""Golden traces of the cluster simulator: fixed scenarios whose every job's allocation history and completion
time are pinned in ``data/sim_golden.json.gz``, so that a change to the engine that changes a result is seen.

The scenarios cover every allocation policy, the three placements, both queue disciplines, two-level trees,
reallocation pauses with ring restarts, heterogeneous workers under both data splits, a partly INA-capable
cluster, and the shared software switch (congestion window, start-up load, per-job delay targets), each over
several seeds. ``python -m tests.unit.sim_golden --write`` records them anew (only when a change of results
is intended: say why in the commit).
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.policies import POLICIES, make_policy
from simulator.calibration import Calibration
from simulator.cluster import ClusterSpec
from simulator.engine import Simulation
from simulator.placement import make_placement
from simulator.trace import (
    JobSpec,
    SyntheticConfig,
    generate_trace,
    interarrival_for_load,
)

FIXTURE = Path(__file__).with_name("data") / "sim_golden.json.gz"
REL = 1e-9


@dataclass(frozen=True)
class Scenario:
    """One simulation run: a cluster, a calibration, a trace and the engine's options."""

    name: str
    cluster: ClusterSpec
    jobs: tuple[JobSpec, ...]
    policy: str
    calibration: Calibration = field(default_factory=Calibration)
    placement: str = "ina-aware"
    options: dict[str, Any] = field(default_factory=dict)

    def run(self) -> dict[str, Any]:
        sim = Simulation(self.cluster, self.calibration, make_policy(self.policy), make_placement(self.placement),
                         check=True, **self.options)
        return record(sim.run(list(self.jobs)))


def record(result) -> dict[str, Any]:
    """What the fixture pins of one run: per job (id, start, finish, range changes, request, uplink bytes, history)."""
    return {"unfinished": result.unfinished,
            "jobs": [[j.job_id, j.start_s, j.finish_s, j.range_changes, j.slots_requested, j.uplink_bytes,
                      [list(h) for h in j.history]] for j in result.jobs]}


def _synthetic(n: int, seed: int, workers: int, load: float = 0.9, **kw: Any) -> tuple[JobSpec, ...]:
    cfg = SyntheticConfig(num_jobs=n, iterations_median=800.0, **kw)
    cfg = dataclasses.replace(cfg, mean_interarrival_s=interarrival_for_load(cfg, workers, load))
    return tuple(generate_trace(cfg, seed))


def _testbed_trace(seed: int) -> tuple[JobSpec, ...]:
    """Jobs like experiment 3's: 4-worker jobs with 64 KiB gradients on one shared software switch, staggered
    arrivals, start-ups with a warm-up all-reduce, two priorities."""
    jobs = []
    for k in range(12):
        jobs.append(JobSpec(job_id=k, arrival_s=1.5 * k + 0.25 * ((k * seed) % 3), num_workers=4, grad_bytes=65536,
                            iterations=12 + (k * 7 + seed) % 9, compute_s=(0.0,), priority=1 if k % 3 == 0 else 0,
                            slots=16, min_slots=4 if seed % 2 else 16, weight=2.0 if k % 3 == 0 else 1.0,
                            startup_s=1.0 + 0.1 * ((k + seed) % 4), startup_iterations=1))
    return tuple(jobs)


TESTBED_CAL = Calibration(ina_rtt_us=637.0, switch_shared_pps=8431.0, worker_startup_packets=0.65 * 8431.0 / 2.0,
                          propagation_rtt_us=40_000.0, realloc_pause_us=300_000.0, ring_step_overhead_us=0.0,
                          ring_goodput_fraction=0.92, ring_move_restarts_op=True, cwnd_min_window=4)


def scenarios() -> Iterator[Scenario]:
    scarce = ClusterSpec(racks=8, workers_per_rack=16, slots_per_switch=128, host_gbps=25)
    for seed in (1, 2, 3):
        jobs = _synthetic(160, seed, scarce.total_workers)
        for policy in POLICIES:
            yield Scenario(f"scarce-{policy}-s{seed}", scarce, jobs, policy)
    plenty = ClusterSpec(racks=6, workers_per_rack=8)
    for seed in (1, 2):
        jobs = _synthetic(120, seed, plenty.total_workers, load=1.2)
        for placement in ("pack", "spread"):
            yield Scenario(f"default-{placement}-s{seed}", plenty, jobs, "weighted", placement=placement)
        yield Scenario(f"default-fifo-s{seed}", plenty, jobs, "first-fit", options={"queue": "fifo"})
    tree = ClusterSpec(racks=6, workers_per_rack=8, spine_slots=1024, uplink_gbps=150)
    for seed in (1, 2):
        jobs = _synthetic(120, seed, tree.total_workers)
        for policy, placement in (("first-fit", "ina-aware"), ("weighted", "spread"), ("priority", "ina-aware")):
            yield Scenario(f"tree-{policy}-{placement}-s{seed}", tree, jobs, policy, placement=placement)
        yield Scenario(f"tree-follow-s{seed}", tree, jobs, "equal", placement="spread", options={"follow_grant": True})
    pauses = Calibration(realloc_pause_us=50_000.0, ring_move_restarts_op=True, propagation_rtt_us=0.5,
                         ring_step_overhead_us=8.0)
    for seed in (1, 2):
        jobs = _synthetic(160, seed, scarce.total_workers)
        for policy in ("equal", "weighted", "priority"):
            yield Scenario(f"pauses-{policy}-s{seed}", scarce, jobs, policy, calibration=pauses)
    half = ClusterSpec(racks=8, workers_per_rack=8, slots_per_switch=256, host_gbps=25, ina_fraction=0.5)
    for seed in (1, 2):
        jobs = _synthetic(150, seed, half.total_workers, hetero=1.0)
        for split in ("equal", "proportional"):
            yield Scenario(f"hetero-{split}-s{seed}", half, jobs, "weighted", placement="pack",
                           options={"data_split": split})
    bed = ClusterSpec(racks=1, workers_per_rack=32, slots_per_switch=48, host_gbps=0.001, uplink_gbps=0.001)
    late = dataclasses.replace(TESTBED_CAL, cwnd_latecomer=True, startup_fair_share=False)
    for seed in (1, 2):
        jobs = _testbed_trace(seed)
        for policy in POLICIES:
            yield Scenario(f"shared-{policy}-s{seed}", bed, jobs, policy, calibration=TESTBED_CAL, placement="pack",
                           options={"follow_grant": True})
        yield Scenario(f"shared-late-s{seed}", bed, jobs, "weighted", calibration=late, placement="pack",
                       options={"follow_grant": True})
    racks = ClusterSpec(racks=3, workers_per_rack=8, slots_per_switch=48, host_gbps=0.001, uplink_gbps=0.002,
                        spine_slots=48)
    yield Scenario("shared-racks", racks, _testbed_trace(3), "first-fit", calibration=TESTBED_CAL, placement="spread")


def compare(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Differences between a pinned run and a new one: times within REL relative, everything else exact."""
    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=REL, abs_tol=REL)

    problems = []
    if expected["unfinished"] != got["unfinished"]:
        problems.append(f"unfinished {got['unfinished']} != {expected['unfinished']}")
    if len(expected["jobs"]) != len(got["jobs"]):
        return [*problems, f"{len(got['jobs'])} jobs finished, expected {len(expected['jobs'])}"]
    for want, have in zip(expected["jobs"], got["jobs"]):
        job_id, start, finish, changes, requested, uplink, history = want
        where = f"job {job_id}"
        if have[0] != job_id or have[3:5] != [changes, requested]:
            problems.append(f"{where}: id/range changes/request {have[0], have[3], have[4]} != {job_id, changes, requested}")
        elif not (close(have[1], start) and close(have[2], finish) and close(have[5], uplink)):
            problems.append(f"{where}: start/finish/uplink {have[1:3] + [have[5]]} != {[start, finish, uplink]}")
        elif len(have[6]) != len(history) or any(
                h[1:] != w[1:] or not close(h[0], w[0]) for h, w in zip(have[6], history)):
            problems.append(f"{where}: history {have[6]} != {history}")
    return problems


def load_fixture() -> dict[str, Any]:
    with gzip.open(FIXTURE, "rt") as fh:
        return json.load(fh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record the fixture anew")
    args = parser.parse_args(argv)
    runs = {s.name: s.run() for s in scenarios()}
    if args.write:
        FIXTURE.parent.mkdir(exist_ok=True)
        with gzip.GzipFile(FIXTURE, "wb", mtime=0) as fh:
            fh.write(json.dumps(runs, separators=(",", ":")).encode())
        print(f"wrote {len(runs)} runs, {sum(len(r['jobs']) for r in runs.values())} jobs to {FIXTURE}")
        return 0
    pinned = load_fixture()
    bad = {name: compare(pinned[name], run) for name, run in runs.items() if compare(pinned[name], run)}
    for name, problems in bad.items():
        print(f"{name}: {len(problems)} difference(s), first: {problems[0]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
