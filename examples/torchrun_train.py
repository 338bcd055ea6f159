"""Train a PyTorch model with DDP on the testbed, through the torch.distributed backend "ina", started by torchrun.

    torchrun --standalone --nproc-per-node 3 examples/torchrun_train.py                     # the agents' ring
    INA_CONTROLLER=10.0.0.100:50051 INA_JOB_SECRET=... torchrun --nproc-per-node 4 --master-addr 10.0.1.1 \\
        --master-port 29500 examples/torchrun_train.py --model cnn                          # through the switch
    torchrun --standalone --nproc-per-node 3 examples/torchrun_train.py --backend gloo      # the reference

The training is a plain DDP script: ``import host_agent.torch_backend`` registers the backend, and
``dist.init_process_group("ina")`` (or ``--backend gloo``) is the only line that names it. With
``$INA_CONTROLLER`` every rank's agent joins one INA job there (rank 0 registers it; the job's secret from
``$INA_JOB_SECRET``, the same on every rank) and follows its grants (INA, ring, Rina, tree); without it the ranks
run the agents' ring among themselves. Each rank's agent binds the address it reaches the rendezvous host from
(the rendezvous host's own where it is that host: under a switch, give ``--master-addr`` the host's address, not
``--standalone``'s localhost). ``--timeout`` is the process group's timeout, and so every agent's.

Each worker's share of the global batch comes from ``--allocation`` (equal, static: profiled once, adaptive:
re-split every epoch from measured compute speeds) through ``WeightedBatchSampler``; each rank scales its loss
by the sampler's ``loss_weight`` (n * b_i / B: the backend never rescales, and DDP averages over the ranks), so the
update is the global batch's mean. ``--slowdown F0,F1,...`` makes worker i F_i times slower (its measured compute
is padded). DDP's all-reduce is timed by ``timed_allreduce_hook`` (DDP's own all-reduce through the group, with a
stopwatch), the same on both backends.

Rank 0 prints held-out accuracy every ``--eval-every`` steps and writes a summary (``--json``): the accuracy
curve, step and communication times, the all-reduce's share of the step, the overlap of communication with
backward, and the final parameters' digest, which every rank checks is the same. ``--save-params PATH.npz`` keeps
the parameters at every evaluation (for comparing runs step by step). See docs/agent.md ("PyTorch").
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import numpy as np

BACKENDS = ("ina", "gloo")
ALLOCATIONS = ("equal", "static", "adaptive")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=BACKENDS, default="ina",
                   help="torch.distributed backend: ina (through the switch, or the agents' ring) or gloo")
    p.add_argument("--timeout", type=float, default=300.0, help="the process group's timeout, seconds")
    p.add_argument("--allocation", choices=ALLOCATIONS, default="equal")
    p.add_argument("--slowdown", default="", help="per-rank slowdown factors, e.g. 1,1,3 (missing ones are 1)")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run all epochs)")
    p.add_argument("--global-batch", type=int, default=96)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0, help="model initialisation and sample order")
    p.add_argument("--eval-every", type=int, default=10, help="steps between held-out evaluations")
    p.add_argument("--bucket-cap-mb", type=float, default=0.025, help="DDP bucket size (small: several buckets to overlap)")
    p.add_argument("--json", help="rank 0 writes the run's summary here")
    p.add_argument("--save-params", help="rank 0 saves the parameters at every evaluation here (.npz)")
    args = p.parse_args(argv)
    for name in ("epochs", "global_batch", "eval_every", "timeout"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    try:
        args.slowdown = [float(f) for f in args.slowdown.split(",") if f]
    except ValueError:
        p.error(f"--slowdown takes numbers separated by commas, got {args.slowdown!r}")
    if any(f < 1 for f in args.slowdown):
        p.error("--slowdown factors must be >= 1")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        p.error("start it with torchrun (RANK and WORLD_SIZE are not set), e.g. torchrun --nproc-per-node 2 " + p.prog)
    return args


# --------------------------------------------------------------------------- model and data


def make_model(kind: str):
    from torch import nn

    if kind == "cnn":  # the 64 features as an 8x8 image
        return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))


def load_data():
    """scikit-learn's digits (8x8 images), split as ``ina-agent train`` splits them: 1437 training, 360 held-out."""
    import torch

    from host_agent.models import digits_split

    d = digits_split()
    return ((torch.from_numpy(d.X_train), torch.from_numpy(d.y_train)),
            (torch.from_numpy(d.X_test), torch.from_numpy(d.y_test)))


def flat_params(model) -> np.ndarray:
    return np.concatenate([p.detach().reshape(-1).numpy() for p in model.parameters()]).astype(np.float32)


# --------------------------------------------------------------------------- training


def train(args: argparse.Namespace) -> dict:
    """Run the worker in a process group that is gone, its threads joined, when this returns.

    PyTorch's shutdown order (docs "Shutdown"): everything that uses the group ends first, then
    ``destroy_process_group``. ``destroy_process_group`` only drops torch's own references: DDP and
    its reducer hold the group, so ``_train`` returns (its DDP and optimizer die with it) before the call.
    ``torch.distributed.nn`` is imported before the group exists: DDP imports it lazily, and its functions
    take ``group=group.WORLD`` as a default argument, which, evaluated after ``init_process_group``, would keep
    the group (and its threads) alive until the interpreter clears its modules at exit. Destroyed there, while
    the interpreter is being torn down, gloo's C++ destructor can abort the process (``terminate called without
    an active exception``, exit -6) after a run that otherwise succeeded.
    """
    import gc

    import torch
    import torch.distributed as dist
    import torch.distributed.nn

    import host_agent.torch_backend  # noqa: F401 (registers the backend "ina")

    torch.set_num_threads(1)  # one core per worker at most: the machine is shared
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    summary = _train(args, dist.get_rank(), dist.get_world_size())
    gc.collect()  # DDP's reference cycles, if any: nothing may hold the group past destroy_process_group
    dist.destroy_process_group()
    return summary


def _allocation(args, model, X, y, rank: int, world: int, slow: float, gather):
    """The run's first allocation: equal, or static (each rank's speed profiled on B/n samples, all-gathered)."""
    import torch.nn.functional as F

    from host_agent.allocation import static_allocation

    B = args.global_batch
    if args.allocation != "static":
        return static_allocation([1.0] * world, B)
    probe = slice(0, max(1, B // world))
    times = []
    for _ in range(5):  # the fastest of 5 forward/backward passes
        t0 = time.perf_counter()
        F.cross_entropy(model(X[probe]), y[probe]).backward()
        times.append((time.perf_counter() - t0) * slow)
    model.zero_grad()
    return static_allocation([float(s) for s in gather(probe.stop / min(times))], B)


def _train(args: argparse.Namespace, rank: int, world: int) -> dict:
    """One worker's training, in the initialised process group; returns the run's summary."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from host_agent.allocation import AdaptiveAllocator, AdaptiveConfig, ComputeMeter
    from host_agent.torch_hook import CommClock, WeightedBatchSampler, timed_allreduce_hook

    def gather(value):
        out = [None] * world
        dist.all_gather_object(out, value)
        return out

    slow = (args.slowdown + [1.0] * world)[rank]
    (X, y), (Xt, yt) = load_data()
    torch.manual_seed(args.seed)
    model = make_model(args.model)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    clock = CommClock()
    ddp.register_comm_hook(clock, timed_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    alloc = _allocation(args, model, X, y, rank, world, slow, gather)
    adaptive = (AdaptiveAllocator.start(AdaptiveConfig(args.global_batch, update_every=None), world)
                if args.allocation == "adaptive" else None)
    sampler = WeightedBatchSampler(len(X), alloc, rank, seed=args.seed)
    meter = ComputeMeter()
    curve, snapshots, steps_log = [], {}, []
    step = samples = 0
    start = time.perf_counter()

    def evaluate() -> None:
        with torch.no_grad():
            logits = model(Xt)
            point = {"step": step, "samples": samples, "seconds": round(time.perf_counter() - start, 4),
                     "accuracy": float((logits.argmax(dim=1) == yt).float().mean()),
                     "loss": float(F.cross_entropy(logits, yt))}
        curve.append(point)
        snapshots[f"step_{step}"] = flat_params(model)
        if rank == 0:
            print(f"step {step:4d}  samples {samples:6d}  {point['seconds']:7.2f} s  held-out accuracy "
                  f"{point['accuracy']:.3f}  loss {point['loss']:.4f}", flush=True)

    evaluate()
    done = False
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for idx in sampler:
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(ddp(X[idx]), y[idx]) * sampler.loss_weight  # n * b_i / B: the global mean
            loss.backward()  # returns once every bucket's all-reduce has completed
            comm = clock.take_step()
            compute = max((time.perf_counter() - t0) - comm.exposed, 1e-9)
            if slow > 1:
                time.sleep((slow - 1) * compute)  # an emulated slower worker: its compute takes F times longer
            meter.add(len(idx), compute * slow)
            opt.step()
            step += 1
            samples += args.global_batch
            steps_log.append({"seconds": time.perf_counter() - t0, "compute": compute * slow, "comm": comm.comm,
                              "hidden": comm.hidden, "exposed": comm.exposed, "buckets": comm.buckets})
            if step % args.eval_every == 0:
                evaluate()
            if args.steps and step >= args.steps:
                done = True
                break
        if adaptive is not None and not done:
            adaptive = adaptive.update([float(s) for s in gather(meter.take())])
            alloc = adaptive.allocation
            sampler.set_allocation(alloc)
        if done:
            break
    if not curve or curve[-1]["step"] != step:
        evaluate()
    elapsed = time.perf_counter() - start
    digest = hashlib.sha256(flat_params(model).tobytes()).hexdigest()
    summary = _summary(args, rank, world, step, samples, elapsed, curve, steps_log, alloc, digest, gather(digest))
    if rank == 0:
        _report(args, summary, snapshots)
    return summary


def _summary(args, rank, world, step, samples, elapsed, curve, steps_log, alloc, digest, digests) -> dict:
    import torch.distributed as dist

    group = dist.group.WORLD
    granted = group.agent.backend.value if args.backend == "ina" else "gloo"  # what the job runs now
    later = steps_log[1:] or steps_log  # the first step includes DDP's bucket rebuild
    med = lambda key: statistics.median(s[key] for s in later) if later else None
    comm_total = sum(s["comm"] for s in later)
    step_total = sum(s["seconds"] for s in later)
    return {
        "backend": args.backend, "granted": granted, "world_size": world, "timeout": args.timeout,
        "allocation": args.allocation, "slowdown": (args.slowdown + [1.0] * world)[:world], "seed": args.seed,
        "model": args.model, "steps": step, "samples": samples, "seconds": round(elapsed, 4),
        "final_accuracy": curve[-1]["accuracy"], "final_loss": curve[-1]["loss"], "curve": curve,
        "batch_sizes": list(alloc.batch_sizes),
        "step_seconds_median": med("seconds"), "compute_seconds_median": med("compute"),
        "comm_seconds_median": med("comm"), "exposed_seconds_median": med("exposed"),
        "buckets_per_step": med("buckets"),
        # how much of a step waits for the all-reduce; the share of the communication hidden behind backward
        "allreduce_share": sum(s["exposed"] for s in later) / step_total if step_total > 0 else None,
        "overlap": sum(s["hidden"] for s in later) / comm_total if comm_total > 0 else None,
        "param_digest": digest, "same_model_on_every_rank": len(set(digests)) == 1,
    }


def _report(args, summary: dict, snapshots: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    if args.save_params:
        np.savez(args.save_params, **snapshots)
    share = summary["allreduce_share"]
    print(f"done: {summary['steps']} steps in {summary['seconds']:.2f} s, held-out accuracy "
          f"{summary['final_accuracy']:.3f}, backend {summary['backend']} ({summary['granted']}), batch sizes "
          f"{summary['batch_sizes']}" + (f", all-reduce {share:.0%} of a step" if share is not None else "")
          + ("" if summary["same_model_on_every_rank"] else "  MODELS DIFFER"), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torchrun_train.py: error: needs torch: pip install torch==2.13.0 (make install adds it)", file=sys.stderr)
        return 2
    summary = train(args)
    return 0 if summary["same_model_on_every_rank"] else 1


if __name__ == "__main__":
    sys.exit(main())
