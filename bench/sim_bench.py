"""Benchmark of ina-sim at the scale of a real cluster trace: every policy over 100,000 synthetic jobs on 1,000 racks
of 8 workers, as a user runs it (the policies in parallel, one process each):

    ina-sim run --synthetic 100000 --racks 1000 --policy all --no-plot --quiet

    python bench/sim_bench.py                 # 3 repetitions (about 2 minutes on 2 cores)
    python bench/sim_bench.py --jobs 20000    # smaller
    python bench/sim_bench.py --philly        # the full Philly trace's size, read from its schema (below)

Prints per repetition the command's wall time and each policy's CPU-seconds (its process: trace, simulation, its
files), then the medians [min-max] with the load average beside them. Goal: under 60 s wall on 2 cores and at most
15 CPU-seconds per policy. Every figure is measured in this run on this machine; compare ratios, not absolute numbers.

``--philly``: a job log of Philly's size (117,325 jobs) written to Philly's cluster_job_log schema from the synthetic
workload (its sizes and run times, at load 0.8 of 312 racks of 8 GPUs), run as a user with the real file would
(``--trace cluster_job_log --trace-format philly --racks 312``): what the full trace costs, reader included.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable from a checkout without installing

from inaproto.commands import Command, command_argv


def run_once(jobs: int, racks: int, out: Path) -> tuple[float, dict[str, float]]:
    """One run of the command: its wall time and each policy's CPU-seconds (from its summary.json)."""
    argv = [*command_argv(Command.SIM), "run", "--synthetic", str(jobs), "--racks", str(racks), "--policy", "all",
            "--no-plot", "--quiet", "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    results = json.loads((out / "summary.json").read_text())["results"]
    return wall, {r["policy"]: r["cpu_s"] for r in results}


PHILLY_JOBS = 117_325  # msr-fiddle/philly-traces: jobs submitted 2017-08-07 to 2017-12-22
PHILLY_RACKS = 312


def write_philly_log(path: Path, jobs: int, racks: int) -> None:
    """A cluster_job_log (Philly's schema) of `jobs` synthetic jobs: one attempt each, its GPUs on 8-GPU machines."""
    from simulator.cluster import ClusterSpec
    from simulator.config import SimConfig
    from simulator.runs import load_trace
    from simulator.trace import SyntheticConfig

    config = SimConfig(cluster=ClusterSpec(racks=racks), workload=SyntheticConfig(num_jobs=jobs))
    log = []
    for job in load_trace(config).jobs:
        run = job.iterations * max(job.compute_s)
        machines = [{"ip": f"m{k}", "gpus": [f"gpu{g}" for g in range(min(8, job.num_workers - 8 * k))]}
                    for k in range(-(-job.num_workers // 8))]
        start = job.arrival_s + 1
        log.append({"status": "Pass", "vc": "v", "jobid": f"application_{job.job_id}", "user": "u",
                    "submitted_time": _stamp(job.arrival_s),
                    "attempts": [{"start_time": _stamp(start), "end_time": _stamp(start + max(1.0, run)),
                                  "detail": machines}]})
    path.write_text(json.dumps(log))


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1502064000 + seconds))  # from 2017-08-07, as Philly's


def philly(repetitions: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cluster_job_log"
        write_philly_log(log, PHILLY_JOBS, PHILLY_RACKS)
        print(f"ina-sim run --trace cluster_job_log --trace-format philly --racks {PHILLY_RACKS} --policy all --no-plot "
              f"--quiet: {PHILLY_JOBS} jobs ({log.stat().st_size / 1e6:.0f} MB of JSON), {repetitions} repetitions")
        walls, cpus = [], {}
        for rep in range(1, repetitions + 1):
            out = Path(tmp) / f"run{rep}"
            argv = [*command_argv(Command.SIM), "run", "--trace", str(log), "--trace-format", "philly", "--racks",
                    str(PHILLY_RACKS), "--policy", "all", "--no-plot", "--quiet", "--out", str(out)]
            started = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - started)
            for r in json.loads((out / "summary.json").read_text())["results"]:
                cpus.setdefault(r["policy"], []).append(r["cpu_s"])
            print(f"  run {rep}: wall {walls[-1]:.1f} s; load {os.getloadavg()[0]:.2f}", flush=True)
        print(f"wall: {spread(walls)} s; CPU-s per policy: " + ", ".join(f"{p} {spread(v)}" for p, v in cpus.items()))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--racks", type=int, default=1000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--philly", action="store_true", help="a job log of Philly's size, in Philly's schema")
    args = parser.parse_args()
    if args.philly:
        philly(args.repetitions)
        return 0
    print(f"ina-sim run --synthetic {args.jobs} --racks {args.racks} --policy all --no-plot --quiet "
          f"({os.cpu_count()} cores), {args.repetitions} repetitions")
    walls: list[float] = []
    cpus: dict[str, list[float]] = {}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(1, args.repetitions + 1):
            wall, cpu = run_once(args.jobs, args.racks, Path(tmp) / f"run{rep}")
            loads.append(os.getloadavg()[0])
            walls.append(wall)
            for policy, seconds in cpu.items():
                cpus.setdefault(policy, []).append(seconds)
            print(f"  run {rep}: wall {wall:.1f} s; CPU-s " + ", ".join(f"{p} {s:.1f}" for p, s in cpu.items())
                  + f"; load {loads[-1]:.2f}", flush=True)
    print(f"wall: {spread(walls)} s (goal < 60 s), load average {spread(loads)}")
    for policy, values in cpus.items():
        print(f"  {policy:<10} {spread(values)} CPU-s (goal <= 15)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
