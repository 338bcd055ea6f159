"""Train a PyTorch model with DDP whose gradients are all-reduced by the INA agent (weighted by b_i / B).

    pip install torch==2.13.0        # the optional extra; a CPU build from local disk
    python examples/torch_ddp_train.py --workers 3 --allocation adaptive --slowdown 1,1,3
    python examples/torch_ddp_train.py --workers 2 --controller 127.0.0.1:50051 --job-name ddp   # INA / Rina

Starts one process per worker on 127.0.0.1. Each initialises a gloo process group (DDP needs one for
its start-up broadcast), joins the job through an ``Agent`` (ring without ``--controller``; with it,
whatever the controller grants), registers the agent's ``weighted`` hook and trains an MLP on a
synthetic 10-class data set shaped like scikit-learn's digits (``host_agent.train.make_dataset``).
With ``static`` or ``adaptive`` allocation a worker that is ``--slowdown`` times slower gets a
smaller share of every global batch; the hook's b_i / B weighting keeps the update the global mean.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from host_agent.agent import bind_worker_sockets  # noqa: E402


def worker(rank: int, args: argparse.Namespace, workers: str, store: str, out) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from host_agent.agent import Agent
    from host_agent.allocation import AdaptiveAllocator, AdaptiveConfig, ComputeMeter, SlowdownCompute, static_allocation
    from host_agent.grant import JobSpec, parse_workers
    from host_agent.torch_hook import AgentHookState, WeightedBatchSampler, get_hook
    from host_agent.train import make_dataset

    n = args.workers
    dist.init_process_group("gloo", store=dist.FileStore(store, n), rank=rank, world_size=n)
    spec = JobSpec(args.job_name, parse_workers(workers), backend=args.backend)
    agent = Agent(spec, rank, controller=args.controller)
    slow = SlowdownCompute(args.slowdown[rank])

    X, y = make_dataset(seed=0)
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    B = args.global_batch
    adaptive = None
    if args.allocation == "adaptive":
        adaptive = AdaptiveAllocator.start(AdaptiveConfig(B, update_every=None), n)
        alloc = adaptive.allocation
    elif args.allocation == "static":
        probe = X[:B]

        def step_time() -> float:
            t0 = time.perf_counter()
            slow(lambda: torch.nn.functional.cross_entropy(model(probe), y[:B]).backward())
            return B / (time.perf_counter() - t0)

        step_time()
        speeds = agent.allgather(np.array([step_time()]))[:, 0]
        alloc = static_allocation(list(speeds), B)
    else:
        alloc = static_allocation([1.0] * n, B)
    state = AgentHookState.for_allocation(agent, alloc)
    ddp.register_comm_hook(state, get_hook("weighted"))
    sampler = WeightedBatchSampler(len(X), alloc, rank, seed=1)
    meter = ComputeMeter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        total = 0.0
        for idx in sampler:
            opt.zero_grad()
            t0, comm0 = time.perf_counter(), state.comm_seconds
            loss = slow(lambda: torch.nn.functional.cross_entropy(ddp(X[idx]), y[idx]))
            slow(loss.backward)  # the hook all-reduces inside backward: its time is not compute
            meter.add(len(idx), max(time.perf_counter() - t0 - (state.comm_seconds - comm0), 1e-9))
            opt.step()
            total += float(loss.detach()) * len(idx) / B
        epoch_loss = float(agent.allreduce(np.array([total], dtype=np.float32))[0]) / len(sampler)
        if adaptive is not None:
            adaptive = adaptive.update(list(agent.allgather(np.array([meter.take()]))[:, 0]))
            alloc = adaptive.allocation
            sampler.set_allocation(alloc)
            state.set_allocation(alloc)
        if rank == 0:
            print(f"epoch {epoch}: loss {epoch_loss:.4f}  {time.perf_counter() - start:.2f} s  "
                  f"next batch sizes {list(alloc.batch_sizes)}  backend {agent.backend}", flush=True)
    acc = float((model(X).argmax(dim=1) == y).float().mean())
    agent.close()
    dist.destroy_process_group()
    out.put((rank, acc))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--controller", help="admission service HOST:PORT (default: ring without a controller)")
    parser.add_argument("--job-name", default="ddp-example")
    parser.add_argument("--backend", default=None, help="auto (with --controller) or ring")
    parser.add_argument("--allocation", choices=("equal", "static", "adaptive"), default="equal")
    parser.add_argument("--slowdown", default="", help="per-worker slowdown factors, e.g. 1,1,3")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=96)
    parser.add_argument("--lr", type=float, default=0.2)
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        parser.error("needs torch: pip install torch==2.13.0")
    args.backend = args.backend or ("auto" if args.controller else "ring")
    factors = [float(f) for f in args.slowdown.split(",") if f] or [1.0]
    args.slowdown = (factors + [1.0] * args.workers)[: args.workers]
    socks = [bind_worker_sockets("127.0.0.1") for _ in range(args.workers)]
    workers = ",".join(f"127.0.0.1:{u.getsockname()[1]}@h{i}" for i, (u, _) in enumerate(socks))
    for u, t in socks:
        u.close()
        t.close()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=worker, args=(r, args, workers, os.path.join(tmp, "store"), out))
                 for r in range(args.workers)]
        for p in procs:
            p.start()
        accs = sorted(out.get(timeout=600) for _ in procs)
        for p in procs:
            p.join()
    print(f"accuracy on the training set: {accs[0][1]:.3f} (every worker holds the same model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
