"""``ina-agent``: one worker of a job, from the command line.

    ina-agent allreduce --controller 127.0.0.1:50051 --workers 10.0.1.1:40000@h1,10.0.1.2:40000@h2 \\
        --worker-id 0 --job-name bench --elements 1000000 --iterations 10
    ina-agent train --controller 127.0.0.1:50051 --job-file job.json --worker-id 1 --allocation adaptive

Every worker of a job is started with the same job (``--workers`` or ``--job-file``) and its own
``--worker-id``. ``allreduce`` benchmarks an all-reduce of a given size and prints time and goodput;
``train`` trains a model on scikit-learn's digits (``host_agent.train``). Both print a summary, and the full results as JSON
with ``--json PATH`` (``-`` for stdout), the agent's whole configuration included. The configuration
(``host_agent.options.AgentOptions``) comes from ``--config FILE`` (TOML) with the flags on top;
``--print-config`` prints it. Progress goes to stderr. Mistakes exit 2 with one line; failures at run time
exit 1 with one line.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from host_agent.compute import SpeedSchedule
from host_agent.grant import JobSpec, parse_workers
from host_agent.options import AgentOptions
from host_agent.timeline import Timeline
from host_agent.train import ALLOCATIONS, ComputeMode, CostModel, TrainConfig
from inaproto.backends import BackendChoice
from inaproto.cli import Parser, UsageError
from inaproto.config import ConfigError, add_config_arguments, as_dict, from_args, to_toml

PROG = "ina-agent"


def _int_at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``, else a one-line usage error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


_nonneg_int = _int_at_least(0)
_positive_int = _int_at_least(1)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be >= 0 and finite, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Worker agent of the INA testbed: all-reduce benchmark and training.")
    parser.add_argument("--version", action="version", version=f"{PROG} 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="{allreduce,train}", parser_class=Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, usage=f"{PROG} {name} [options]")
        job = p.add_argument_group("the job (the same on every worker)")
        src = job.add_mutually_exclusive_group()
        src.add_argument("--workers", metavar="LIST", help="IP:PORT[/MAC][@HOST],... of every worker, ids 0, 1, ...")
        src.add_argument("--job-file", metavar="FILE", help="the job as JSON (name, backend, workers, secret)")
        job.add_argument("--job-name", metavar="NAME", help="rendezvous key at the controller (default ina-job)")
        job.add_argument("--backend", metavar="NAME", choices=list(BackendChoice), help="auto, ina, ring or rina (default auto)")
        job.add_argument("--requested-slots", metavar="N", type=int, help="slots to ask for (0: what the policy gives)")
        me = p.add_argument_group("this worker")
        me.add_argument("--worker-id", metavar="ID", type=int, help="its id in the job (required)")
        me.add_argument("--controller", metavar="ADDR", help="admission service HOST:PORT (none: the ring only)")
        me.add_argument("--job-id", metavar="ID", type=int, help="join this registered job, not one found by name")
        me.add_argument("--timeout", type=_positive_float, metavar="S", help="seconds without progress (default 60)")
        add_config_arguments(me, example="stream.op_timeout=30")
        me.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH ('-': stdout)")
        me.add_argument("--quiet", action="store_true", help="no progress display")
        me.add_argument("-v", "--verbose", action="store_true", help="log protocol events (generations, resyncs)")
        return p

    ar = command("allreduce", "benchmark an all-reduce of a given size")
    run = ar.add_argument_group("the benchmark")
    run.add_argument("--elements", metavar="N", type=_positive_int, default=1_000_000, help="float32 elements (default 1000000)")
    run.add_argument("--iterations", metavar="N", type=_positive_int, default=5, help="timed all-reduces (default 5)")
    run.add_argument("--warmup", metavar="N", type=int, default=1, help="untimed all-reduces first (default 1)")
    run.add_argument("--check", action="store_true", help="check the sum every worker can predict")

    tr = command("train", "train a model on the digits with an allocation mode")
    run = tr.add_argument_group("training")
    run.add_argument("--allocation", metavar="MODE", choices=ALLOCATIONS, default="equal",
                     help="equal, static or adaptive (default equal)")
    run.add_argument("--compute", metavar="MODE", choices=[m.value for m in ComputeMode], default="emulated",
                     help="emulated (numpy MLP) or torch (CNN) (default emulated)")
    run.add_argument("--steps", metavar="N", type=_positive_int, default=50, help="training steps (default 50)")
    run.add_argument("--global-batch", metavar="N", type=_positive_int, default=240, help="samples per step (default 240)")
    run.add_argument("--lr", metavar="X", type=_positive_float, default=0.5, help="SGD learning rate (default 0.5)")
    run.add_argument("--per-sample-ms", metavar="MS", type=_positive_float, default=0.5,
                     help="emulated: ms per sample at speed 1 (default 0.5)")
    run.add_argument("--speed", metavar="SPEEDS", type=_schedule, default=None,
                     help="SPEED[,STEP:SPEED...]: 1,30:0.333 a straggler")
    run.add_argument("--device-slowdown", metavar="F", type=_positive_float, default=1.0,
                     help="torch: speed 1 is F x slower than a core (1)")
    run.add_argument("--jitter", metavar="X", type=_nonneg_float, default=0.0, help="emulated: spread of step times (0)")
    run.add_argument("--update-every", metavar="N", type=_positive_int, default=2, help="adaptive: steps per window (2)")
    run.add_argument("--cost-model", metavar="NAME", choices=[m.value for m in CostModel], default=None,
                     help="proportional or affine (default by --compute)")
    run.add_argument("--eval-every", metavar="N", type=_positive_int, default=2, help="steps between evaluations (2)")
    run.add_argument("--target-accuracy", metavar="X", type=_positive_float, default=None, help="held-out accuracy to time")
    run.add_argument("--seed", metavar="N", type=int, default=0, help="initialisation and sample order (default 0)")
    return parser


def _schedule(text: str) -> SpeedSchedule:
    try:
        return SpeedSchedule.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _job_spec(args: argparse.Namespace) -> JobSpec:
    if not (args.workers or args.job_file):
        raise UsageError("one of the arguments --workers --job-file is required")
    if args.worker_id is None:
        raise UsageError("the following arguments are required: --worker-id")
    if args.job_file:
        try:
            with open(args.job_file) as fh:
                spec = JobSpec.from_json(fh.read())
        except OSError as exc:
            raise UsageError(f"cannot read job file: {exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"bad job file {args.job_file}: {exc}") from None
    else:
        try:
            workers = parse_workers(args.workers)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        spec = JobSpec(args.job_name or "ina-job", workers)
    changes = {}
    if args.job_name:
        changes["name"] = args.job_name
    if args.backend:
        changes["backend"] = args.backend
    if args.requested_slots is not None:
        changes["requested_slots"] = args.requested_slots
    if getattr(args, "elements", None):
        changes["tensor_elements"] = args.elements
    try:
        spec = replace(spec, **changes)
        spec.worker(args.worker_id)
    except (ValueError, KeyError) as exc:
        raise UsageError(str(exc).strip("'\"")) from None
    if args.controller is None and spec.backend not in (BackendChoice.RING, BackendChoice.AUTO):
        raise UsageError(f"--backend {spec.backend} needs --controller (without one only the ring runs)")
    return spec


def agent_options(args: argparse.Namespace) -> AgentOptions:
    """The agent's configuration: ``--config FILE`` (or the defaults), its ``--set`` settings, the flags on top."""
    try:
        return from_args(AgentOptions, args, {"stream.op_timeout": args.timeout, "rendezvous_timeout": args.timeout})
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _open_agent(args: argparse.Namespace, spec: JobSpec, options: AgentOptions):
    from host_agent.agent import Agent

    return Agent(spec, args.worker_id, controller=args.controller, job_id=args.job_id, options=options)


class _Progress:
    def __init__(self, enabled: bool, label: str) -> None:
        self.enabled = enabled
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, done: int, total: int, text: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self.last < (0.1 if self.tty else 2.0):
            return
        self.last = now
        line = f"{self.label}: {done}/{total} {text}"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if done >= total else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _emit(results: dict, path: str | None) -> None:
    if path is None:
        return
    text = json.dumps(results, indent=2, sort_keys=True)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as fh:
            fh.write(text + "\n")


def _cmd_allreduce(args: argparse.Namespace, options: AgentOptions) -> int:
    timeline = Timeline()
    spec = _job_spec(args)
    if args.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    progress = _Progress(not args.quiet, f"worker {args.worker_id} allreduce")
    rng = np.random.default_rng(args.worker_id)
    data = rng.standard_normal(args.elements).astype(np.float32)
    agent = _open_agent(args, spec, options)
    timeline.mark_opened()
    times: list[float] = []
    try:
        total = args.warmup + args.iterations
        out = None
        for i in range(total):
            started = time.time()
            t0 = time.perf_counter()
            out = agent.allreduce(data)
            dt = time.perf_counter() - t0
            timeline.mark_call(started)
            if i >= args.warmup:
                times.append(dt)
            progress(i + 1, total, f"{dt * 1e3:.1f} ms ({agent.backend})")
        ok = None
        if args.check:  # every worker's input comes from its worker id: the exact sum is known to all
            from host_agent.fixedpoint import dequantize, quantize

            exact_sum = sum(quantize(np.random.default_rng(w).standard_normal(args.elements).astype(np.float32),
                                 agent.scale).astype(np.int64) for w in spec.worker_ids)
            ok = bool(np.array_equal(out, dequantize(exact_sum, agent.scale)))
        stats = agent.stats.as_dict()
        backend, generation = agent.backend, agent.generation
        n = agent.size
    finally:
        agent.close()
        timeline.mark_closed()
    cpu = agent.cpu_report()
    nbytes = args.elements * 4
    best, mean = min(times), sum(times) / len(times)
    results = {
        "command": "allreduce", "worker_id": args.worker_id, "workers": n, "backend": backend,
        "generation": generation, "elements": args.elements, "bytes": nbytes, "iterations": args.iterations,
        "seconds": times, "seconds_mean": mean, "seconds_best": best,
        "goodput_gbps": nbytes * 8 / mean / 1e9, "stats": stats, "check": ok, **cpu,
        "timeline": timeline.as_dict(), "options": as_dict(options),
    }
    print(f"worker {args.worker_id}: {backend} all-reduce of {args.elements} float32 ({nbytes / 1e6:.1f} MB) "
          f"over {n} workers: mean {mean * 1e3:.2f} ms, best {best * 1e3:.2f} ms, "
          f"goodput {results['goodput_gbps']:.3f} Gbit/s, retransmits {stats['retransmits']}")
    _emit(results, args.json)
    return 0


def _cmd_train(args: argparse.Namespace, options: AgentOptions) -> int:
    spec = _job_spec(args)
    try:
        cfg = TrainConfig(allocation=args.allocation, compute=args.compute, steps=args.steps,
                          global_batch=args.global_batch, lr=args.lr, per_sample_s=args.per_sample_ms / 1e3,
                          speed=args.speed or SpeedSchedule(1.0), jitter=args.jitter, update_every=args.update_every,
                          eval_every=args.eval_every, target_accuracy=args.target_accuracy, seed=args.seed,
                          cost_model=args.cost_model, device_slowdown=args.device_slowdown)
        if cfg.compute is ComputeMode.TORCH and any(v > 1 for v in (cfg.speed.base, *(v for _, v in cfg.speed.changes))):
            raise ValueError("--compute torch emulates slower devices only: speeds must be <= 1")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from host_agent.train import model_size, train

    spec = replace(spec, tensor_elements=model_size(cfg) + 1 + len(spec.workers))  # gradient, loss, compute times
    progress = _Progress(not args.quiet, f"worker {args.worker_id} train")
    agent = _open_agent(args, spec, options)
    # A full garbage collection with torch loaded walks ~165k objects (~0.1 s); during training it would
    # stall this worker's all-reduce and so every worker's step. This process only trains: freeze what
    # exists (torch, the data set, the agent) so that collections see only what training makes.
    gc.collect()
    gc.freeze()
    try:
        result = train(agent, cfg, progress=lambda s, t, loss, alloc: progress(
            s, t, f"loss {loss:.4f} batch {alloc.batch_sizes[agent.rank]}/{alloc.global_batch} ({agent.backend})"))
        backend, stats = agent.backend, agent.stats.as_dict()
    finally:
        agent.close()
    results = {"command": "train", "worker_id": args.worker_id, "workers": len(spec.workers), "backend": backend,
               "allocation": str(cfg.allocation), "config": cfg.as_dict(), **result.as_dict(), "stats": stats,
               "options": as_dict(options)}
    ttt = "" if result.time_to_target_s is None else f", accuracy {cfg.target_accuracy:g} at {result.time_to_target_s:.2f} s"
    print(f"worker {args.worker_id}: trained {cfg.steps} steps ({cfg.allocation}, {cfg.compute}, {backend}): loss "
          f"{result.losses[0]:.4f} -> {result.losses[-1]:.4f}, held-out accuracy {result.accuracy:.3f}{ttt}, "
          f"{result.seconds:.2f} s ({result.compute_seconds:.2f} compute, {result.comm_seconds:.2f} all-reduce), "
          f"final batch sizes {result.batch_sizes[-1]}")
    _emit(results, args.json)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("choose a command: allreduce or train (see --help)")
        options = agent_options(args)
        if args.print_config:
            print(to_toml(options), end="")
            return 0
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format=f"{PROG}[%(threadName)s] %(levelname)s %(message)s")
        if args.command == "allreduce":
            return _cmd_allreduce(args, options)
        return _cmd_train(args, options)
    except UsageError as exc:
        return exc.report(PROG)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line for the user; -v logs the details
        logging.getLogger("host_agent.cli").debug("failure", exc_info=True)
        print(f"{PROG}: error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1


def run() -> None:
    """The console entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
