"""``ina-agent``: one worker of a job, from the command line.

    ina-agent allreduce --controller 127.0.0.1:50051 --workers 10.0.1.1:40000@h1,10.0.1.2:40000@h2 \\
        --worker-id 0 --job-name bench --elements 1000000 --iterations 10
    ina-agent train --controller 127.0.0.1:50051 --job-file job.json --worker-id 1 --allocation adaptive

Every worker of a job is started with the same job (``--workers`` or ``--job-file``) and its own
``--worker-id``. ``allreduce`` benchmarks an all-reduce of a given size and prints time and goodput;
``train`` trains a model on scikit-learn's digits (``host_agent.train``). Both print a summary, and the full results as JSON
with ``--json PATH`` (``-`` for stdout). Progress goes to stderr. Mistakes exit 2 with one line;
failures at run time exit 1 with one line.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from host_agent.compute import SpeedSchedule
from host_agent.flight import QueryMode
from host_agent.grant import JobSpec, parse_workers
from host_agent.host_member import CopyMode
from host_agent.ring_pieces import PIECE_BYTES
from host_agent.stream import StreamOptions
from host_agent.timeline import Timeline
from host_agent.train import ALLOCATIONS, ComputeMode, CostModel, TrainConfig
from host_agent.udp_io import IoMode
from inaproto.backends import BackendChoice
from inaproto.cli import Parser, UsageError

PROG = "ina-agent"
QUERIES_ENV = "INA_AGENT_QUERIES"  # default of --queries: lets ina-exp runs compare the loss recovery
LOSS_SIGNALS_ENV = "INA_AGENT_LOSS_SIGNALS"  # default of --loss-signals: lets ina-exp runs compare with and without
IO_ENV = "INA_AGENT_IO"  # default of --io: lets a launcher (ina-exp) force per-packet I/O on every agent
RING_PIECES_ENV = "INA_RING_PIECE_BYTES"  # default of --ring-piece-bytes: lets ina-exp runs compare the ring's pipelining
RING_BLOCK_SECONDS_ENV = "INA_RING_BLOCK_SECONDS"  # default of --ring-block-seconds: A/B of the ring's row blocks
RING_BLOCK_BYTES_ENV = "INA_RING_BLOCK_BYTES"  # default of --ring-block-bytes


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


def _bundle_frames(text: str) -> int:
    from inaproto.rina_partitions import BUNDLE_FRAMES

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= BUNDLE_FRAMES:
        raise argparse.ArgumentTypeError(f"must be in 1..{BUNDLE_FRAMES}, got {value}")
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

    def common(p: argparse.ArgumentParser) -> None:
        job = p.add_argument_group("job (the same on every worker)")
        src = job.add_mutually_exclusive_group(required=True)
        src.add_argument("--workers", help="IP:PORT[/MAC][@HOST],... of every worker; ids are positions (0, 1, ...)")
        src.add_argument("--job-file", help="JSON job description (name, backend, workers: see docs/agent.md)")
        job.add_argument("--job-name", help="job name, the rendezvous key at the controller (default: from the job file, else 'ina-job')")
        job.add_argument("--backend", choices=list(BackendChoice), help="all-reduce backend (default: from the job file, else auto)")
        job.add_argument("--requested-slots", type=int, default=None, help="slots to ask for (0: what the policy gives)")
        p.add_argument("--worker-id", type=int, required=True, help="this worker's id")
        p.add_argument("--controller", help="admission service HOST:PORT; without it only --backend ring runs")
        p.add_argument("--job-id", type=int, help="join this registered job instead of finding it by name")
        p.add_argument("--controller-retry", type=_positive_float, default=30.0, metavar="S",
                       help="retry controller calls this long while it is unavailable (restarting) (default 30); "
                            "the job's secret comes from the job file's 'secret' or $INA_JOB_SECRET, TLS from $INA_TLS_CA")
        p.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds without progress before giving up (default 60)")
        p.add_argument("--path-rtt-floor-ms", type=_nonneg_float, default=None, metavar="MS",
                       help="override the grant's path round-trip floor, ms (the controller sizes it from the "
                            "link rates; the congestion window's path round trip never goes below it; 0: none)")
        p.add_argument("--reorder-guard", type=_nonneg_float, default=0.0,
                       help="seconds between a chunk's last send and its slot's reuse, for switches without "
                            "the per-copy seq check on networks that reorder (default 0: off)")
        p.add_argument("--io", choices=[m.value for m in IoMode], default=os.environ.get(IO_ENV, IoMode.PER_PACKET.value),
                       help="UDP I/O: GSO sends and batched drains where the kernel has them, or one "
                            f"system call per packet (default: ${IO_ENV}, else batched; docs/agent.md, 'I/O')")
        p.add_argument("--queries", choices=[m.value for m in QueryMode],
                       default=os.environ.get(QUERIES_ENV, QueryMode.OFF.value),
                       help="when loss found early is asked of the switch (QUERY) instead of resending the gradient: "
                            f"never, after a resend, or first (default: ${QUERIES_ENV}, else off; docs/agent.md, 'Queries')")
        p.add_argument("--loss-signals", choices=["on", "off"], default=os.environ.get(LOSS_SIGNALS_ENV, "on"),
                       help="number INA gradients so the switch reports this worker's lost frames and each result "
                            "names the job's previous completion: resend own losses at once, leave a peer's to the "
                            f"peer (default: ${LOSS_SIGNALS_ENV}, else on; docs/agent.md, 'Loss signals')")
        p.add_argument("--ring-piece-bytes", type=_nonneg_int, default=os.environ.get(RING_PIECES_ENV, str(PIECE_BYTES)),
                       metavar="B", help="pieces ring steps are pipelined by, bytes (0: whole chunks, unpipelined; "
                                         f"default: ${RING_PIECES_ENV}, else {PIECE_BYTES}; docs/agent.md, 'Ring')")
        p.add_argument("--ring-block-seconds", type=_nonneg_float, default=os.environ.get(RING_BLOCK_SECONDS_ENV, "0"),
                       metavar="S", help="a ring phase runs in row blocks of about S seconds of wire time each, so a "
                                         "move off the ring loses one block (0: the rest of a call as one op; default: "
                                         f"${RING_BLOCK_SECONDS_ENV}, else 0 for now; docs/agent.md, 'Ring')")
        p.add_argument("--ring-block-bytes", type=_nonneg_int, default=os.environ.get(RING_BLOCK_BYTES_ENV, "0"),
                       metavar="B", help="row blocks of B bytes instead (0: sized by --ring-block-seconds; default: "
                                         f"${RING_BLOCK_BYTES_ENV}, else 0)")
        p.add_argument("--rina-chains", action="store_true",
                       help="follow Rina grants as chains across switches even where the grant does not say so "
                            "(the controller's grant says so by default: docs/agent.md, \"Rina as designed\")")
        p.add_argument("--rina-bundle-frames", type=_bundle_frames, default=None, metavar="N",
                       help="INA payloads per datagram between Rina host members' copies (runs under one header; 1: single INA payloads; default 11)")
        p.add_argument("--rina-copy", choices=[m.value for m in CopyMode], default=None,
                       help="where a Rina host member's copy runs: a thread of the agent or a child process of its "
                            "own (default process; docs/agent.md, \"Rina as designed\")")
        p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH ('-' for stdout)")
        p.add_argument("--quiet", action="store_true", help="no progress display")
        p.add_argument("-v", "--verbose", action="store_true", help="log protocol events (generations, resyncs)")

    ar = sub.add_parser("allreduce", help="benchmark an all-reduce of a given size")
    common(ar)
    ar.add_argument("--elements", type=_positive_int, default=1_000_000, help="float32 elements (default 1000000)")
    ar.add_argument("--iterations", type=_positive_int, default=5, help="timed all-reduces (default 5)")
    ar.add_argument("--warmup", type=int, default=1, help="untimed all-reduces first (default 1)")
    ar.add_argument("--check", action="store_true", help="verify the sum against the value every worker can predict")

    tr = sub.add_parser("train", help="train a model on the digits with an allocation mode")
    common(tr)
    tr.add_argument("--allocation", choices=ALLOCATIONS, default="equal", help="data allocation (default equal)")
    tr.add_argument("--compute", choices=[m.value for m in ComputeMode], default="emulated",
                    help="emulated: numpy MLP, step time = batch x --per-sample-ms / speed; torch: PyTorch CNN, "
                         "measured and scaled to the speed (default emulated)")
    tr.add_argument("--steps", type=_positive_int, default=50, help="training steps (default 50)")
    tr.add_argument("--global-batch", type=_positive_int, default=240, help="samples per step over all workers (default 240)")
    tr.add_argument("--lr", type=_positive_float, default=0.5, help="SGD learning rate (default 0.5)")
    tr.add_argument("--per-sample-ms", type=_positive_float, default=0.5, help="emulated: ms per sample at speed 1 (default 0.5)")
    tr.add_argument("--speed", metavar="SPEED[,STEP:SPEED...]", type=_schedule, default=None,
                    help="this worker's relative speed (<= 1 for --compute torch), optionally changing at steps: "
                         "1,30:0.333,60:1 is a straggler (default 1)")
    tr.add_argument("--slowdown", type=float, default=None, help="the same as --speed 1/SLOWDOWN (>= 1)")
    tr.add_argument("--slowdown-at", metavar="STEP:FACTOR", type=_step_factor, default=None,
                    help="from STEP on, this worker is FACTOR times slower (a mid-run speed change)")
    tr.add_argument("--device-slowdown", type=_positive_float, default=1.0,
                    help="torch: the device of speed 1 is this many times slower than one host core, so every "
                         "worker sleeps to its device time and host contention does not set the pace (>= 1, default 1)")
    tr.add_argument("--jitter", type=_nonneg_float, default=0.0, help="emulated: relative spread of step times (default 0)")
    tr.add_argument("--update-every", type=_positive_int, default=2, help="adaptive: steps per measurement window (default 2)")
    tr.add_argument("--cost-model", choices=[m.value for m in CostModel], default=None,
                    help="static/adaptive: compute time proportional to the batch, or affine (a per-step constant "
                         "plus a per-sample cost, fitted) (default: proportional for emulated, affine for torch)")
    tr.add_argument("--eval-every", type=_positive_int, default=2, help="steps between held-out evaluations (default 2)")
    tr.add_argument("--target-accuracy", type=_positive_float, default=None, help="held-out accuracy for time to target")
    tr.add_argument("--seed", type=int, default=0, help="initialisation and sample order (default 0)")
    return parser


def _schedule(text: str) -> SpeedSchedule:
    try:
        return SpeedSchedule.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _speed_of(args: argparse.Namespace) -> SpeedSchedule:
    """--speed, or the older --slowdown / --slowdown-at (speed = 1 / slowdown)."""
    if args.speed is not None and (args.slowdown is not None or args.slowdown_at is not None):
        raise UsageError("give --speed or --slowdown/--slowdown-at, not both")
    if args.speed is not None:
        return args.speed
    slowdown = 1.0 if args.slowdown is None else args.slowdown
    if not (slowdown >= 1 and slowdown < float("inf")):
        raise UsageError(f"--slowdown must be >= 1, got {slowdown}")
    changes = () if args.slowdown_at is None else ((args.slowdown_at[0], 1.0 / args.slowdown_at[1]),)
    return SpeedSchedule(1.0 / slowdown, changes)


def _step_factor(text: str) -> tuple[int, float]:
    try:
        step, factor = text.split(":")
        value = (int(step), float(factor))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STEP:FACTOR, e.g. 20:3, got {text!r}") from None
    if value[0] < 0 or not value[1] >= 1:
        raise argparse.ArgumentTypeError(f"STEP must be >= 0 and FACTOR >= 1, got {text!r}")
    return value


def _job_spec(args: argparse.Namespace) -> JobSpec:
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


def _open_agent(args: argparse.Namespace, spec: JobSpec):
    from host_agent.agent import Agent, AgentOptions

    opts = AgentOptions(stream=StreamOptions(op_timeout=args.timeout, reorder_guard=args.reorder_guard,
                                               io=IoMode(args.io), rina_chains=args.rina_chains,
                                               path_rtt_floor=None if args.path_rtt_floor_ms is None
                                               else args.path_rtt_floor_ms / 1e3,
                                               queries=QueryMode(args.queries),
                                               loss_signals=args.loss_signals == "on",
                                               ring_piece_bytes=args.ring_piece_bytes,
                                               ring_block_seconds=args.ring_block_seconds,
                                               ring_block_bytes=args.ring_block_bytes),
                        rendezvous_timeout=args.timeout, controller_retry=args.controller_retry,
                        **({"rina_bundle_frames": args.rina_bundle_frames} if args.rina_bundle_frames else {}),
                        **({"rina_copy": CopyMode(args.rina_copy)} if args.rina_copy else {}))
    return Agent(spec, args.worker_id, controller=args.controller, job_id=args.job_id, options=opts)


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


def _cmd_allreduce(args: argparse.Namespace) -> int:
    timeline = Timeline()
    spec = _job_spec(args)
    if args.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    progress = _Progress(not args.quiet, f"worker {args.worker_id} allreduce")
    rng = np.random.default_rng(args.worker_id)
    data = rng.standard_normal(args.elements).astype(np.float32)
    agent = _open_agent(args, spec)
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
        "timeline": timeline.as_dict(),
    }
    print(f"worker {args.worker_id}: {backend} all-reduce of {args.elements} float32 ({nbytes / 1e6:.1f} MB) "
          f"over {n} workers: mean {mean * 1e3:.2f} ms, best {best * 1e3:.2f} ms, "
          f"goodput {results['goodput_gbps']:.3f} Gbit/s, retransmits {stats['retransmits']}")
    _emit(results, args.json)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    spec = _job_spec(args)
    try:
        cfg = TrainConfig(allocation=args.allocation, compute=args.compute, steps=args.steps,
                          global_batch=args.global_batch, lr=args.lr, per_sample_s=args.per_sample_ms / 1e3,
                          speed=_speed_of(args), jitter=args.jitter, update_every=args.update_every,
                          eval_every=args.eval_every, target_accuracy=args.target_accuracy, seed=args.seed,
                          cost_model=args.cost_model, device_slowdown=args.device_slowdown)
        if cfg.compute is ComputeMode.TORCH and any(v > 1 for v in (cfg.speed.base, *(v for _, v in cfg.speed.changes))):
            raise ValueError("--compute torch emulates slower devices only: speeds must be <= 1")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from host_agent.train import model_size, train

    spec = replace(spec, tensor_elements=model_size(cfg) + 1 + len(spec.workers))  # gradient, loss, compute times
    progress = _Progress(not args.quiet, f"worker {args.worker_id} train")
    agent = _open_agent(args, spec)
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
               "allocation": str(cfg.allocation), "config": cfg.as_dict(), **result.as_dict(), "stats": stats}
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
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format=f"{PROG}[%(threadName)s] %(levelname)s %(message)s")
        if args.command == "allreduce":
            return _cmd_allreduce(args)
        return _cmd_train(args)
    except UsageError as exc:
        return exc.report(PROG)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line for the user; -v logs the details
        logging.getLogger("host_agent.cli").debug("failure", exc_info=True)
        print(f"{PROG}: error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1


AGENT_THREAD_PREFIXES = ("watch-job", "heartbeat-job", "agent-idle-job", "ring-")
WARM_START = "--warm-start"  # ina-agent --warm-start READY: imports first, then its arguments from stdin


def warm_start(argv: Sequence[str]) -> list[str] | None:
    """``ina-agent --warm-start READY``: a process started ahead of its job (``Testbed.prestart``).

    It imports everything a worker needs (the interpreter's and the agent's start-up: 0.5-0.7 CPU-s, which
    on a shared 2-core testbed every job's completion time carried and every running job paid for), creates
    the file READY, then waits for one line on stdin: its arguments as a JSON list. Returns them; None when
    stdin closed without a line (the job never came). Raises UsageError on anything else.
    """
    if len(argv) != 2 or not argv[1]:
        raise UsageError(f"usage: {PROG} {WARM_START} READY_FILE (then the arguments as one JSON line on stdin)")
    import host_agent.agent  # noqa: F401  (what _open_agent imports, loaded before the job arrives)

    try:
        with open(argv[1], "w"):
            pass
    except OSError as exc:
        raise UsageError(f"{WARM_START}: cannot create {argv[1]}: {exc.strerror or exc}") from None
    line = sys.stdin.readline()
    if not line.strip():
        return None
    try:
        args = json.loads(line)
    except ValueError as exc:
        raise UsageError(f"{WARM_START}: the line on stdin is not JSON ({exc})") from None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise UsageError(f"{WARM_START}: the line on stdin must be a JSON list of strings")
    return args


def run() -> None:
    """The console entry point: ``main`` (after :func:`warm_start` with ``--warm-start``), then a prompt exit.

    Once ``main`` returns, the results are written and ``Agent.close`` has ended the job's threads, event
    stream and channel: the process exits at once (``os._exit`` after flushing its streams and logs) instead
    of tearing the interpreter down, which took a worker 0.3-0.8 s of a job's completion time on the loaded
    testbed (experiment 3's ``exit`` phase, docs/experiments.md) and, with one of the agent's threads still
    alive (a stuck controller call), could hang in gRPC's finalizers. Such threads are named in a warning.
    """
    argv: list[str] | None = sys.argv[1:]
    if argv[:1] == [WARM_START]:
        try:
            argv = warm_start(argv)
        except UsageError as exc:
            sys.exit(exc.report(PROG))
        if argv is None:
            sys.exit(0)
    code = main(argv)
    stuck = [t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith(AGENT_THREAD_PREFIXES)]
    if stuck:
        print(f"{PROG}: warning: threads still running at exit ({', '.join(stuck)}); exiting without waiting",
              file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
