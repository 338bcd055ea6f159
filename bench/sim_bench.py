"""Benchmark of ina-sim at the scale of a real cluster trace: every policy over 100,000 synthetic jobs on 1,000 racks
of 8 workers, as a user runs it (the policies in parallel, one process each):

    ina-sim run --synthetic 100000 --racks 1000 --policy all --no-plot --quiet

    python bench/sim_bench.py                 # 3 repetitions (about 2 minutes on 2 cores)
    python bench/sim_bench.py --jobs 20000    # smaller

Prints per repetition the command's wall time and each policy's CPU-seconds (its process: trace, simulation, its
files), then the medians [min-max] with the load average beside them. Goal: under 60 s wall on 2 cores and at most
15 CPU-seconds per policy. Every figure is measured in this run on this machine; compare ratios, not absolute numbers.
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


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--racks", type=int, default=1000)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
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
