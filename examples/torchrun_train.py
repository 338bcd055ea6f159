"""Train a PyTorch model with DDP on the testbed: gradients all-reduced by the INA agent, started by torchrun.

    torchrun --nproc-per-node 3 examples/torchrun_train.py                        # ring, no controller
    torchrun --nproc-per-node 2 examples/torchrun_train.py --controller 10.0.0.100:50051   # INA / Rina
    torchrun --nnodes 2 --node-rank R --nproc-per-node 2 --master-addr 10.0.1.1 --master-port 29500 \\
        examples/torchrun_train.py --controller 10.0.0.100:50051 --allocation adaptive --slowdown 1,1,3,3

Every process torchrun starts is one worker (global rank = worker id). It initialises a gloo process
group from torchrun's environment (DDP broadcasts the initial parameters with it; the script also
exchanges its control values over it: worker addresses, measured speeds, a digest of the model), binds
its agent's UDP socket and TCP listener on the address that routes towards the rendezvous host
(``--agent-ip`` to choose), all-gathers every worker's address, and joins the INA job at
``--controller`` (without it the job runs on the agent's ring; with it, the job's secret comes from
``$INA_JOB_SECRET``, the same on every worker). DDP's gradient buckets then go through
the agent's asynchronous hook (``--comm ina``, the default) or through DDP's own gloo float all-reduce
(``--comm gloo``, the reference). Each worker's share of the global batch comes from ``--allocation``
(equal, static: profiled once, adaptive: re-split every epoch from measured compute speeds) through
``WeightedBatchSampler``; the hook weights each gradient by b_i / B so the update is the global mean.
``--slowdown F0,F1,...`` makes worker i F_i times slower (its measured compute is padded).

Rank 0 prints held-out accuracy every ``--eval-every`` steps and writes a summary (``--json``): the
accuracy curve, step and communication times, the overlap of communication with backward, and the
final parameters' digest, which every rank checks is the same. ``--save-params PATH.npz`` keeps the
parameters at every evaluation (for comparing runs step by step). See docs/agent.md ("PyTorch").
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import numpy as np

COMMS = ("ina", "gloo")
ALLOCATIONS = ("equal", "static", "adaptive")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--controller", help="INA controller's admission service HOST:PORT (default: the agent's ring, no controller)")
    p.add_argument("--comm", choices=COMMS, default="ina", help="gradient all-reduce: the INA agent's hook, or DDP's own gloo")
    p.add_argument("--backend", choices=("auto", "ina", "rina", "ring"), default=None,
                   help="agent backend (default: auto with --controller, ring without)")
    p.add_argument("--numerics", choices=("block", "fixed"), default="block",
                   help="block: a power-of-two scale per block of values, agreed by all workers; fixed: the job's scale")
    p.add_argument("--sync-hook", action="store_true", help="all-reduce inside the hook (no overlap; for comparison)")
    p.add_argument("--job-name", help="INA job name (default: torchrun-<rendezvous id>)")
    p.add_argument("--requested-slots", type=int, default=0, help="switch slots to ask for (0: the controller decides)")
    p.add_argument("--agent-ip", help="address of this worker's agent (default: the one that routes to the rendezvous host)")
    p.add_argument("--agent-host", default="",
                   help="this worker's topology host name for the controller (default: the controller finds it by IP)")
    p.add_argument("--agent-port", type=int, default=0, help="agent port of local rank 0 (others +1...; 0: any free port)")
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
    for name in ("epochs", "global_batch", "eval_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        args.slowdown = [float(f) for f in args.slowdown.split(",") if f]
    except ValueError:
        p.error(f"--slowdown takes numbers separated by commas, got {args.slowdown!r}")
    if any(f < 1 for f in args.slowdown):
        p.error("--slowdown factors must be >= 1")
    if args.comm == "gloo" and (args.controller or args.backend):
        p.error("--comm gloo uses no agent: drop --controller/--backend")
    args.backend = args.backend or ("auto" if args.controller else "ring")
    if args.backend != "ring" and args.comm == "ina" and not args.controller:
        p.error(f"--backend {args.backend} needs --controller")
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
    """Training and held-out split (1437 / 360) of the digits-shaped data set of ``host_agent.train``."""
    import torch

    from host_agent.train import make_dataset

    X, y = make_dataset(seed=0)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    X, y = torch.from_numpy(X.astype(np.float32)), torch.from_numpy(y)
    return (X[:1437], y[:1437]), (X[1437:], y[1437:])


def flat_params(model) -> np.ndarray:
    return np.concatenate([p.detach().reshape(-1).numpy() for p in model.parameters()]).astype(np.float32)


# --------------------------------------------------------------------------- joining


def agent_address(explicit: str | None) -> str:
    """This worker's agent IP: given, or the source address of the route towards the rendezvous host."""
    if explicit:
        return explicit
    target = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(target), 9))  # no packet is sent: only a route lookup
        return s.getsockname()[0]


def join(args: argparse.Namespace, rank: int, world: int, gather):
    """The worker's ``Agent``: bind, all-gather every worker's address over gloo, join the job."""
    from host_agent.agent import Agent, bind_worker_sockets
    from host_agent.grant import JobSpec, Worker
    from inaproto.credentials import JOB_SECRET_ENV

    ip = agent_address(args.agent_ip)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    udp, tcp = bind_worker_sockets(ip, args.agent_port + local if args.agent_port else 0)
    addresses = gather((ip, udp.getsockname()[1], args.agent_host))
    workers = tuple(Worker(i, a_ip, port, "", host) for i, (a_ip, port, host) in enumerate(addresses))
    name = args.job_name or f"torchrun-{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}"
    # The job's secret comes from the environment (whoever launches the workers sets it), never argv.
    spec = JobSpec(name, workers, backend=args.backend, requested_slots=args.requested_slots,
                   tensor_elements=sum(p.numel() for p in make_model(args.model).parameters()),
                   secret=os.environ.get(JOB_SECRET_ENV, ""))
    return Agent(spec, rank, controller=args.controller, sock=udp, listener=tcp)


# --------------------------------------------------------------------------- training


def gloo_weighted_hook(weight_of, bucket):
    """DDP's own gloo float all-reduce, each bucket weighted by b_i / B first (equal allocation: DDP's default)."""
    import torch.distributed as dist

    tensor = bucket.buffer().mul_(weight_of())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


def train(args: argparse.Namespace) -> dict:
    """Run the worker in a gloo process group that is gone, its threads joined, when this returns.

    PyTorch's shutdown order (docs "Shutdown"): everything that uses the group ends first, then
    ``destroy_process_group``. ``destroy_process_group`` only drops torch's own references: DDP and
    its reducer hold the group, so ``_train`` returns (its DDP, optimizer and hook state die with it)
    before the call. ``torch.distributed.nn`` is imported before the group exists: DDP imports it
    lazily, and its functions take ``group=group.WORLD`` as a default argument, which, evaluated after
    ``init_process_group``, would keep the group (and gloo's worker threads) alive until the
    interpreter clears its modules at exit. Destroyed there, while the interpreter is being torn
    down, the group's C++ destructor can abort the process (``terminate called without an active
    exception``, exit -6) after a run that otherwise succeeded.
    """
    import gc

    import torch
    import torch.distributed as dist
    import torch.distributed.nn

    torch.set_num_threads(1)  # one core per worker at most: the machine is shared
    dist.init_process_group("gloo")
    summary = _train(args, dist.get_rank(), dist.get_world_size())
    gc.collect()  # DDP's reference cycles, if any: nothing may hold the group past destroy_process_group
    dist.destroy_process_group()
    return summary


def _train(args: argparse.Namespace, rank: int, world: int) -> dict:
    """One worker's training, in the initialised process group; returns the run's summary."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from host_agent.allocation import AdaptiveAllocator, AdaptiveConfig, ComputeMeter, static_allocation
    from host_agent.torch_hook import AgentHookState, Numerics, WeightedBatchSampler, get_hook

    def gather(value):
        out = [None] * world
        dist.all_gather_object(out, value)
        return out

    slow = (args.slowdown + [1.0] * world)[rank]
    (X, y), (Xt, yt) = load_data()
    torch.manual_seed(args.seed)
    model = make_model(args.model)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    B = args.global_batch

    if args.allocation == "static":  # profile: the fastest of 5 forward/backward passes on B/n samples
        probe = slice(0, max(1, B // world))
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            F.cross_entropy(model(X[probe]), y[probe]).backward()
            times.append((time.perf_counter() - t0) * slow)
        model.zero_grad()
        alloc = static_allocation([float(s) for s in gather(probe.stop / min(times))], B)
    else:
        alloc = static_allocation([1.0] * world, B)
    adaptive = AdaptiveAllocator.start(AdaptiveConfig(B, update_every=None), world) if args.allocation == "adaptive" else None

    agent = state = None
    if args.comm == "ina":
        agent = join(args, rank, world, gather)
        state = AgentHookState.for_allocation(agent, alloc, numerics=Numerics(args.numerics),
                                              asynchronous=not args.sync_hook)
        ddp.register_comm_hook(state, get_hook("weighted"))
    elif args.allocation != "equal":
        weight = [alloc.gradient_scale(rank)]
        ddp.register_comm_hook(lambda: weight[0], gloo_weighted_hook)

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
            loss = F.cross_entropy(ddp(X[idx]), y[idx])
            loss.backward()  # the hook's futures complete inside: backward returns with the averaged gradient
            t1 = time.perf_counter()
            comm = state.take_step() if state is not None else None
            compute = max((t1 - t0) - (comm.exposed if comm else 0.0), 1e-9)
            if slow > 1:
                time.sleep((slow - 1) * compute)  # an emulated slower worker: its compute takes F times longer
            meter.add(len(idx), compute * slow)
            opt.step()
            step += 1
            samples += B
            steps_log.append({"seconds": time.perf_counter() - t0, "compute": compute * slow,
                              **({"comm": comm.comm, "hidden": comm.hidden, "exposed": comm.exposed,
                                  "buckets": comm.buckets} if comm else {})})
            if step % args.eval_every == 0:
                evaluate()
            if args.steps and step >= args.steps:
                done = True
                break
        if adaptive is not None and not done:
            adaptive = adaptive.update([float(s) for s in gather(meter.take())])
            alloc = adaptive.allocation
            sampler.set_allocation(alloc)
            if state is not None:
                state.set_allocation(alloc)
            elif args.comm == "gloo":
                weight[0] = alloc.gradient_scale(rank)
        if done:
            break
    if not curve or curve[-1]["step"] != step:
        evaluate()
    elapsed = time.perf_counter() - start

    digest = hashlib.sha256(flat_params(model).tobytes()).hexdigest()
    digests = gather(digest)
    backend = agent.backend if agent is not None else "gloo"
    if state is not None:
        state.close()
    if agent is not None:
        agent.close()

    later = steps_log[1:] or steps_log  # the first step includes DDP's bucket rebuild
    med = lambda key: statistics.median(s[key] for s in later) if later and key in later[0] else None
    comm_total = sum(s.get("comm", 0.0) for s in later)
    summary = {
        "comm": args.comm, "backend": backend, "numerics": args.numerics if args.comm == "ina" else "float32",
        "asynchronous_hook": args.comm == "ina" and not args.sync_hook, "world_size": world,
        "allocation": args.allocation, "slowdown": (args.slowdown + [1.0] * world)[:world], "seed": args.seed,
        "model": args.model, "steps": step, "samples": samples, "seconds": round(elapsed, 4),
        "final_accuracy": curve[-1]["accuracy"], "final_loss": curve[-1]["loss"], "curve": curve,
        "batch_sizes": list(alloc.batch_sizes),
        "step_seconds_median": med("seconds"), "compute_seconds_median": med("compute"),
        "comm_seconds_median": med("comm"), "exposed_seconds_median": med("exposed"),
        "buckets_per_step": med("buckets"),
        # the share of all communication time that ran while backward was still computing
        "overlap": (sum(s.get("hidden", 0.0) for s in later) / comm_total) if comm_total > 0 else None,
        "param_digest": digest, "same_model_on_every_rank": len(set(digests)) == 1,
    }
    if rank == 0:
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        if args.save_params:
            np.savez(args.save_params, **snapshots)
        print(f"done: {step} steps in {elapsed:.2f} s, held-out accuracy {summary['final_accuracy']:.3f}, "
              f"backend {backend}, batch sizes {summary['batch_sizes']}"
              + (f", overlap {summary['overlap']:.2f}" if summary["overlap"] is not None else "")
              + ("" if summary["same_model_on_every_rank"] else "  MODELS DIFFER"), flush=True)
    return summary


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
