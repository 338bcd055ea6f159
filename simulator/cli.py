"""``ina-sim``: compare slot-allocation policies on a cluster-scale trace.

    ina-sim run --synthetic 1000 --racks 64 --slots 1024 --seed 1 --out results/sim   # every policy, in parallel
    ina-sim run --trace cluster_job_log --trace-format philly --config cluster.toml   # a Philly job log
    ina-sim run --print-config > sim.toml                                             # every setting, documented
    ina-sim sweep grid.toml                                  # a grid of runs, tables and plots with intervals
    ina-sim sweep grid.toml --scheduler tcp://host:8786      # ... on a Dask cluster you already run
    ina-sim gen-trace 1000 --seed 1 --out trace.csv
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from controller.policies import POLICIES, make_policy
from inaproto.cli import Parser, UsageError
from inaproto.config import ConfigError, add_config_arguments, as_dict, from_args, load, parse_settings, to_toml
from simulator.calibration import CalibrationError
from simulator.config import SimConfig
from simulator.placement import PLACEMENTS
from simulator.report import write_comparison
from simulator.runs import load_trace, run_policies
from simulator.sweep import SweepConfig, run_sweep, write_sweep
from simulator.trace import TraceError, TraceFormat, write_trace

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


def build_parser() -> Parser:
    parser = Parser(prog="ina-sim", description="Cluster-scale simulation of INA slot-allocation policies.",
                    epilog="Every other setting (cluster, workload, calibration, queue, ...): ina-sim run --print-config.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,sweep,gen-trace}")

    run = sub.add_parser("run", help="simulate one trace under several allocation policies, in parallel, and compare",
                         epilog="Settings without a flag: --set KEY=VALUE or --config FILE (--print-config lists them).")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--trace", type=Path, metavar="FILE", help="a trace CSV, or a job log with --trace-format")
    src.add_argument("--synthetic", type=_nonneg_int, metavar="N", help="a synthetic trace of N jobs from --seed")
    run.add_argument("--trace-format", choices=[f.value for f in TraceFormat],
                     help="FILE is a trace CSV (default), Philly's cluster_job_log or Helios' cluster_log.csv")
    run.add_argument("--policy", type=_policies, metavar="LIST",
                     help=f"comma-separated allocation policies, or 'all' ({', '.join(POLICIES)}; default all)")
    run.add_argument("--placement", choices=sorted(PLACEMENTS), help="placement policy (default ina-aware)")
    run.add_argument("--racks", type=_positive_int, help="racks, one ToR switch each (default 64)")
    run.add_argument("--slots", type=_nonneg_int, help="aggregator slots per INA switch (default 1024)")
    run.add_argument("--seed", type=int, help="seed of the synthetic trace and of a job log's model draws (default 1)")
    run.add_argument("--out", type=Path, help="output directory (default results/sim)")
    run.add_argument("--no-plot", action="store_true", help="skip comparison.png")
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_config_arguments(run, example="cluster.host_gbps=25")

    sweep = sub.add_parser("sweep", help="a grid of runs (policies x settings x seeds): one table and plot per setting")
    sweep.add_argument("grid", type=Path, metavar="GRID.toml", help="the grid: [base] settings and [grid] values")
    sweep.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on the Dask cluster at ADDRESS (needs the dask extra); default: local processes")
    sweep.add_argument("--processes", type=_nonneg_int, default=0, help="local processes (default 0: one per core)")
    sweep.add_argument("--out", type=Path, help="output directory (default: the grid's out, results/sweep)")
    sweep.add_argument("--no-plot", action="store_true", help="tables only")

    gen = sub.add_parser("gen-trace", help="write a synthetic trace CSV (the workload of --config at its load)")
    gen.add_argument("num_jobs", type=_nonneg_int, metavar="N", help="number of jobs")
    gen.add_argument("--out", type=Path, required=True, help="trace CSV to write")
    gen.add_argument("--seed", type=int, help="random seed (default 1)")
    gen.add_argument("--config", type=Path, metavar="FILE", help="settings (workload, cluster, load) from this TOML file")
    gen.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                     help="one setting over the file (repeatable)")
    return parser


def run_config(args: argparse.Namespace) -> SimConfig:
    """The effective configuration of `ina-sim run`: the --config file, its --set settings, then the flags given."""
    flags = {"trace": args.trace, "trace_format": args.trace_format, "workload.num_jobs": args.synthetic,
             "policies": args.policy, "placement": args.placement, "cluster.racks": args.racks,
             "cluster.slots_per_switch": args.slots, "seed": args.seed, "out": args.out,
             "plot": False if args.no_plot else None}
    config = from_args(SimConfig, args, flags)
    return dataclasses.replace(config, trace=None) if args.synthetic is not None else config


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    config = run_config(args)
    if args.print_config:
        sys.stdout.write(to_toml(config))
        return 0
    if args.trace is None and args.synthetic is None and config.trace is None:
        raise UsageError("one of the arguments --trace --synthetic is required (or a trace in --config)",
                         f"{parser.prog} run")
    trace = load_trace(config)
    if trace.skipped and not args.quiet:
        print(f"[ina-sim] {config.trace}: skipped {trace.skipped} job(s) without GPUs or run time", file=sys.stderr)
    config.out.mkdir(parents=True, exist_ok=True)
    write_trace(config.out / "trace.csv", trace.jobs)
    runs = run_policies(config, progress=None if args.quiet else 2.0, trace=trace)
    cluster = config.cluster
    title = (f"{trace.name}: {cluster.racks} racks x {cluster.workers_per_rack} workers, {cluster.slots_per_switch} "
             f"slots/switch, {cluster.host_gbps:g} Gbit/s hosts, placement {config.placement}")
    summaries = write_comparison(config.out, runs, {"trace": trace.name, "jobs": len(trace.jobs), **as_dict(config)},
                                 cluster.ina_switches * cluster.slots_per_switch, title, plot=config.plot)
    print(f"{'policy':<11} {'mean JCT':>10} {'p50 JCT':>10} {'p99 JCT':>10} {'makespan':>11} {'slots held':>10} "
          f"{'misses':>7} {'CPU':>7}")
    for s, r in zip(summaries, runs):
        print(f"{s['policy']:<11} {s['mean_jct_s']:>9.0f}s {s['p50_jct_s']:>9.0f}s {s['p99_jct_s']:>9.0f}s "
              f"{s['makespan_s']:>10.0f}s {s['slot_utilisation']:>9.1%} {s['deadline_misses']:>4}/{s['deadline_jobs']}"
              f" {r.cpu_s:>6.1f}s")
    print(f"results in {config.out}/")
    return 0


@contextlib.contextmanager
def sweep_executor(scheduler: str | None, processes: int) -> Iterator[concurrent.futures.Executor]:
    """Where the sweep's points run: the Dask cluster at `scheduler` (distributed.Client(ADDRESS).get_executor()),
    else a pool of local processes (one per core when `processes` is 0)."""
    if scheduler is None:
        with concurrent.futures.ProcessPoolExecutor(max_workers=processes or os.cpu_count()) as pool:
            yield pool
        return
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--scheduler needs Dask's distributed: pip install 'ina-testbed[dask]'") from None
    with Client(scheduler) as client:
        yield client.get_executor()


def _sweep(args: argparse.Namespace) -> int:
    sweep = load(SweepConfig, args.grid, {"out": args.out})
    with sweep_executor(args.scheduler, args.processes) as executor:
        rows = run_sweep(sweep, executor)
    written = write_sweep(sweep, rows, plot=not args.no_plot)
    print(f"{len(rows)} runs; " + ", ".join(p.name for p in written) + f" in {sweep.out}/")
    return 0


def _gen(args: argparse.Namespace) -> int:
    overrides = {**parse_settings(args.settings), "workload.num_jobs": args.num_jobs, "seed": args.seed}
    config = load(SimConfig, args.config, overrides)
    trace = load_trace(dataclasses.replace(config, trace=None))
    write_trace(args.out, trace.jobs)
    print(f"wrote {len(trace.jobs)} jobs to {args.out} (seed {config.seed}, load {config.load:g} of "
          f"{config.cluster.total_workers} workers)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args_or_exit(argv)
    try:
        if args.command == "run":
            return _run(args, parser)
        if args.command == "sweep":
            return _sweep(args)
        return _gen(args)
    except UsageError as exc:
        raise SystemExit(exc.report(exc.prog or parser.prog)) from None
    except (TraceError, CalibrationError, ConfigError, ValueError) as exc:
        print(f"ina-sim: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"ina-sim: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
