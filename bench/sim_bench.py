"""Benchmark of the cluster simulator (ina-sim): simulated jobs and events per second, and how run time
grows with trace length.

    python bench/sim_bench.py            # 100 .. 10,000 jobs on 64 racks x 8 workers; every policy at 1,000 jobs
    python bench/sim_bench.py --quick    # 100 .. 1,000 jobs

Every figure is measured in this one run on this machine; compare ratios, not absolute numbers.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable from a checkout without installing

from controller.policies import POLICIES, make_policy
from simulator.calibration import Calibration
from simulator.cluster import ClusterSpec
from simulator.engine import Simulation
from simulator.placement import make_placement
from simulator.trace import SyntheticConfig, generate_trace, interarrival_for_load


def run_once(num_jobs: int, policy: str, cluster: ClusterSpec, seed: int) -> tuple[float, int, int]:
    cfg = SyntheticConfig(num_jobs=num_jobs)
    cfg = SyntheticConfig(num_jobs=num_jobs, mean_interarrival_s=interarrival_for_load(cfg, cluster.total_workers, 0.8))
    jobs = generate_trace(cfg, seed)
    sim = Simulation(cluster, Calibration(), make_policy(policy), make_placement("ina-aware"))
    start = time.perf_counter()
    result = sim.run(jobs)
    wall = time.perf_counter() - start
    return wall, result.events, len(result.jobs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stop at 1,000 jobs")
    parser.add_argument("--policy", default="weighted", choices=sorted(POLICIES), help="policy for the scaling series")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    cluster = ClusterSpec(racks=64, workers_per_rack=8, slots_per_switch=1024)
    sizes = [100, 300, 1000] if args.quick else [100, 300, 1000, 3000, 10000]
    print(f"cluster: {cluster.racks} racks ({cluster.ina_switches} INA switches) x {cluster.workers_per_rack} workers, "
          f"{cluster.slots_per_switch} slots/switch; synthetic trace at load 0.8, placement ina-aware")

    print(f"\nscaling, policy {args.policy}:")
    print(f"{'jobs':>7} {'events':>8} {'wall s':>8} {'jobs/s':>9} {'events/s':>10} {'us/event':>9}")
    series = []
    for n in sizes:
        wall, events, done = run_once(n, args.policy, cluster, args.seed)
        series.append((n, wall, events))
        print(f"{n:>7} {events:>8} {wall:>8.3f} {done / wall:>9.0f} {events / wall:>10.0f} {1e6 * wall / events:>9.1f}",
              flush=True)
    (n0, w0, e0), (n1, w1, e1) = series[0], series[-1]
    print(f"growth {n0} -> {n1} jobs: x{n1 / n0:.0f} jobs, x{e1 / e0:.1f} events, x{w1 / w0:.1f} run time "
          f"(per-event cost x{(w1 / e1) / (w0 / e0):.2f}; 1.00 = linear in events)")

    scarce = ClusterSpec(racks=64, workers_per_rack=16, slots_per_switch=128, host_gbps=25)
    for label, spec in (("plentiful memory, as above", cluster),
                        ("scarce memory: 16 workers/rack, 128 slots, 25 Gbit/s (docs/simulation.md)", scarce)):
        print(f"\n1,000 jobs on 64 switches, every policy; {label}:")
        print(f"{'policy':<10} {'wall s':>8} {'jobs/s':>9} {'events/s':>10}")
        for name in POLICIES:
            wall, events, done = run_once(1000, name, spec, args.seed)
            print(f"{name:<10} {wall:>8.3f} {done / wall:>9.0f} {events / wall:>10.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
