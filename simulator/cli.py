"""``ina-sim``: compare slot-allocation policies on a cluster-scale trace.

    ina-sim run --synthetic 1000 --policy equal,first-fit,weighted,priority --placement ina-aware \\
        --racks 64 --workers-per-rack 8 --slots 1024 --seed 1 --out results/sim
    ina-sim gen-trace 1000 --seed 1 --out trace.csv
    ina-sim show-calibration > calibration.json
    ina-sim tree-compare --out results/tree            # trees vs Rina vs ring, packing vs spreading (issue 15)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from controller.policies import POLICIES, make_policy
from inaproto.cli import Parser, UsageError
from simulator.calibration import Calibration, CalibrationError, load_calibration
from simulator.cluster import ClusterSpec
from simulator.engine import Simulation
from simulator.placement import PLACEMENTS, make_placement
from simulator.report import write_all
from simulator.trace import (
    SyntheticConfig,
    TraceError,
    generate_trace,
    interarrival_for_load,
    read_job_log,
    read_trace,
    write_trace,
)

__all__ = ["build_parser", "main"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _nonneg_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(POLICIES)
    for name in names:
        try:
            make_policy(name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError("give a comma-separated list of distinct policy names, or 'all'")
    return names


def _add_workload(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("synthetic workload (see docs/simulation.md)")
    g.add_argument("--load", type=_positive_float, default=0.8,
                   help="offered load (compute only) as a fraction of the cluster's workers; sets the "
                        "mean inter-arrival time unless --mean-interarrival is given (default 0.8)")
    g.add_argument("--mean-interarrival", type=_positive_float, metavar="SECONDS",
                   help="mean of the exponential inter-arrival times (overrides --load)")
    g.add_argument("--hetero", type=float, default=0.0,
                   help="worker heterogeneity h: each worker computes in c*(1+h*U(0,1)) (default 0)")
    g.add_argument("--deadline-fraction", type=_fraction, default=0.3, help="share of jobs with a deadline (default 0.3)")
    g.add_argument("--iterations-median", type=_positive_float, default=3000.0,
                   help="median iterations per job, log-normal (default 3000)")


def _add_cluster(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cluster")
    g.add_argument("--racks", type=_positive_int, default=64, help="racks, one ToR switch each (default 64)")
    g.add_argument("--workers-per-rack", type=_positive_int, default=8, help="workers per rack (default 8)")
    g.add_argument("--slots", type=_nonneg_int, default=1024, help="aggregator slots per INA switch (default 1024)")
    g.add_argument("--ina-fraction", type=_fraction, default=1.0, help="share of ToRs that are INA-capable (default 1)")
    g.add_argument("--host-gbps", type=_positive_float, default=100.0, help="worker link speed (default 100)")
    g.add_argument("--uplink-gbps", type=_positive_float, default=400.0, help="ToR-to-spine speed per rack (default 400)")
    g.add_argument("--spine-slots", type=_nonneg_int, default=0,
                   help="aggregator slots of the spine; > 0 lets jobs spanning racks run as two-level trees (default 0)")


def build_parser() -> Parser:
    parser = Parser(prog="ina-sim", description="Cluster-scale simulation of INA slot-allocation policies.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,gen-trace,show-calibration,tree-compare}")

    run = sub.add_parser("run", help="simulate one trace under several allocation policies and compare them")
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", type=Path, metavar="FILE", help="trace CSV (docs/simulation.md), or a job log with --trace-format")
    src.add_argument("--synthetic", type=_nonneg_int, metavar="N", help="generate N synthetic jobs from --seed")
    run.add_argument("--trace-format", choices=("trace", "philly", "helios"), default="trace",
                     help="FILE is a trace CSV (default), a Philly cluster_job_log JSON or a Helios-style CSV job log")
    run.add_argument("--max-jobs", type=_positive_int, help="use only the first N jobs of the trace")
    run.add_argument("--policy", type=_policies, default=list(POLICIES),
                     help=f"comma-separated allocation policies, or 'all' ({', '.join(POLICIES)}; default all)")
    run.add_argument("--placement", choices=sorted(PLACEMENTS), default="ina-aware", help="placement policy (default ina-aware)")
    run.add_argument("--follow-grant", action="store_true",
                     help="a job holding slots aggregates in-network even where ring would be faster (as ina-agent --backend auto)")
    run.add_argument("--queue", choices=("backfill", "fifo"), default="backfill",
                     help="start any waiting job that fits (backfill, default) or strictly in order (fifo)")
    run.add_argument("--data-split", choices=("equal", "proportional"), default="equal",
                     help="how a heterogeneous job splits its batch over workers (default equal)")
    run.add_argument("--calibration", type=Path, metavar="FILE", help="JSON calibration (ina-sim show-calibration for a template)")
    run.add_argument("--seed", type=int, default=1, help="seed of the synthetic trace and of job-log model draws (default 1)")
    run.add_argument("--out", type=Path, default=Path("results/sim"), help="output directory (default results/sim)")
    run.add_argument("--no-plot", action="store_true", help="skip the PNG")
    run.add_argument("--check", action="store_true", help="validate every switch's allocation after every event (slower)")
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    _add_cluster(run)
    _add_workload(run)

    gen = sub.add_parser("gen-trace", help="write a synthetic trace CSV")
    gen.add_argument("num_jobs", type=_nonneg_int, metavar="N", help="number of jobs")
    gen.add_argument("--out", type=Path, required=True, help="trace CSV to write")
    gen.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    gen.add_argument("--cluster-workers", type=_positive_int, default=512,
                     help="workers of the cluster the load is computed for (default 512 = 64 racks x 8)")
    _add_workload(gen)

    sub.add_parser("show-calibration", help="print the default calibration as JSON (a template for --calibration)")

    tree = sub.add_parser("tree-compare", help="the fixed scenario of docs/simulation.md: two-level trees vs Rina vs "
                                               "ring, packing vs spreading; medians over seeds")
    tree.add_argument("--seeds", type=lambda t: tuple(int(x) for x in t.split(",")), default=(1, 2, 3),
                      help="comma-separated seeds of the synthetic trace (default 1,2,3)")
    tree.add_argument("--jobs", type=_positive_int, default=300, help="jobs per trace (default 300)")
    tree.add_argument("--calibration", type=Path, metavar="FILE", help="JSON calibration (default: the built-in one)")
    tree.add_argument("--out", type=Path, required=True, help="directory for summary.json")
    return parser


def _synthetic_config(args: argparse.Namespace, num_jobs: int, total_workers: int) -> SyntheticConfig:
    cfg = SyntheticConfig(
        num_jobs=num_jobs,
        hetero=args.hetero,
        deadline_fraction=args.deadline_fraction,
        iterations_median=args.iterations_median,
    )
    interarrival = args.mean_interarrival or interarrival_for_load(cfg, total_workers, args.load)
    return dataclasses.replace(cfg, mean_interarrival_s=interarrival)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.hetero < 0:
        parser.error("--hetero must be >= 0")
    cluster = ClusterSpec(
        racks=args.racks,
        workers_per_rack=args.workers_per_rack,
        slots_per_switch=args.slots,
        ina_fraction=args.ina_fraction,
        host_gbps=args.host_gbps,
        uplink_gbps=args.uplink_gbps,
        spine_slots=args.spine_slots,
    )
    calibration = load_calibration(args.calibration)
    if args.synthetic is not None:
        cfg = _synthetic_config(args, args.synthetic, cluster.total_workers)
        jobs = generate_trace(cfg, args.seed)
        trace_name = f"synthetic {args.synthetic} jobs, seed {args.seed}"
    elif args.trace_format == "trace":
        jobs = read_trace(args.trace)
        trace_name = args.trace.name
    else:
        jobs, skipped = read_job_log(args.trace, fmt=args.trace_format, seed=args.seed, max_jobs=args.max_jobs)
        trace_name = f"{args.trace.name} ({args.trace_format})"
        if skipped and not args.quiet:
            print(f"[ina-sim] {args.trace}: skipped {skipped} job(s) without GPUs or run time", file=sys.stderr)
    if args.max_jobs is not None:
        jobs = jobs[: args.max_jobs]
    too_big = [j.job_id for j in jobs if j.num_workers > cluster.total_workers]
    if too_big:
        raise ValueError(
            f"{len(too_big)} job(s) need more than the cluster's {cluster.total_workers} workers (first: job {too_big[0]})"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    write_trace(args.out / "trace.csv", jobs)
    results = []
    for name in args.policy:
        sim = Simulation(
            cluster,
            calibration,
            make_policy(name),
            make_placement(args.placement),
            data_split=args.data_split,
            queue=args.queue,
            follow_grant=args.follow_grant,
            check=args.check,
            progress=None if args.quiet else 2.0,
        )
        result = sim.run(jobs)
        results.append(result)
        if not args.quiet:
            print(f"[ina-sim] {name}: {len(jobs)} jobs, {result.events} events in {result.wall_s:.2f} s", file=sys.stderr)
    config = {
        "trace": trace_name,
        "jobs": len(jobs),
        "seed": args.seed,
        "placement": args.placement,
        "queue": args.queue,
        "data_split": args.data_split,
        "cluster": dataclasses.asdict(cluster),
        "calibration": dataclasses.asdict(calibration),
    }
    summaries = write_all(args.out, results, config, plot=not args.no_plot)
    header = f"{'policy':<11} {'mean JCT':>10} {'p50 JCT':>10} {'p99 JCT':>10} {'makespan':>11} {'slots held':>10} {'misses':>7}"
    print(header)
    for s in summaries:
        print(
            f"{s['policy']:<11} {s['mean_jct_s']:>9.0f}s {s['p50_jct_s']:>9.0f}s {s['p99_jct_s']:>9.0f}s "
            f"{s['makespan_s']:>10.0f}s {s['slot_utilisation']:>9.1%} {s['deadline_misses']:>4}/{s['deadline_jobs']}"
        )
    print(f"results in {args.out}/")
    return 0


def _gen(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.hetero < 0:
        parser.error("--hetero must be >= 0")
    cfg = _synthetic_config(args, args.num_jobs, args.cluster_workers)
    jobs = generate_trace(cfg, args.seed)
    write_trace(args.out, jobs)
    print(f"wrote {len(jobs)} jobs to {args.out} (mean inter-arrival {cfg.mean_interarrival_s:.1f} s, seed {args.seed})")
    return 0


def _tree(args: argparse.Namespace) -> int:
    from simulator.scenarios import TreeScenario, tree_comparison

    scenario = TreeScenario(jobs=args.jobs, seeds=args.seeds)
    summary = tree_comparison(scenario, load_calibration(args.calibration))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{'fabric':<6} {'placement':<10} {'mean JCT':>18} {'p99 JCT':>9} {'spine slots':>12} {'uplink TB':>10}  backends")
    for r in summary["runs"]:
        shares = ", ".join(f"{b} {v:.0%}" for b, v in r["backend_time_share"].items() if v >= 0.005)
        print(f"{r['fabric']:<6} {r['placement']:<10} {r['mean_jct_s']:>7.0f} s [{r['mean_jct_s_min']:.0f}-{r['mean_jct_s_max']:.0f}]"
              f" {r['p99_jct_s']:>7.0f} s {r['spine_slot_utilisation']:>11.1%} {r['uplink_bytes_total'] / 1e12:>10.2f}  {shares}")
    print(f"{len(scenario.seeds)} seeds; summary in {args.out}/summary.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args_or_exit(argv)
    try:
        if args.command == "run":
            return _run(args, parser)
        if args.command == "gen-trace":
            return _gen(args, parser)
        if args.command == "tree-compare":
            return _tree(args)
        sys.stdout.write(Calibration().to_json())
        return 0
    except UsageError as exc:
        raise SystemExit(exc.report(parser.prog)) from None
    except (TraceError, CalibrationError, ValueError) as exc:
        print(f"ina-sim: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"ina-sim: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
