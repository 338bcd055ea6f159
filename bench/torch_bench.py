"""``dist.all_reduce`` through the backend "ina" against gloo, in Mininet on experiment 1's links (root).

    flock /tmp/ina-integration.lock .venv/bin/python bench/torch_bench.py --workers 8 [--json PATH]

For each worker count n: a star of n hosts (every link ``--bw`` Mbit/s, ``--rtt-ms`` of round trip to the
switch: experiment 1's regime, topologies/experiments/allreduce.py) behind ina-switch with the real controller;
``torchrun --nnodes n`` (one rank per host) of this file's worker, which times ``dist.all_reduce`` of
``--elements`` float32 (256 Ki: 1 MiB) after a barrier, ``--warmup`` untimed then ``--iterations`` timed calls; a
call's time is the slowest rank's. The backends alternate (ina, gloo, ina, gloo, ...) for ``--repetitions``
runs each; every run's median is one sample, and the figures are the medians over the runs [min-max], with the
machine's load beside them. The "ina" call is the whole ``all_reduce``: the block floating point's exponent
exchange (an extra stream call before the values) is counted in it.

Printed against INA's framed wire time (every worker sends and receives the tensor once in 184-byte frames of
128 bytes) and the framed ideal ratio INA/ring (gloo's all-reduce of this size is a ring: ``2(n-1)/n`` of the
tensor each way per link, in full TCP segments).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BACKENDS = ("ina", "gloo")
RDZV_PORT = 29611


def worker(args: argparse.Namespace) -> None:
    """One rank (started by torchrun): time ``dist.all_reduce``; rank 0 writes every call's slowest rank."""
    import torch
    import torch.distributed as dist

    import host_agent.torch_backend  # noqa: F401 (registers "ina")

    torch.set_num_threads(1)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.randn(args.elements, generator=torch.Generator().manual_seed(rank))
    times = []
    for i in range(args.warmup + args.iterations):
        t.div_(n)  # the values stay in range however many calls
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    everyone: list = [None] * n
    dist.all_gather_object(everyone, times)
    granted = dist.group.WORLD.agent.backend.value if args.backend == "ina" else "gloo"
    if rank == 0:
        Path(args.out).write_text(json.dumps({"backend": args.backend, "granted": granted, "workers": n,
                                              "calls": [max(c) for c in zip(*everyone)]}) + "\n")
    dist.destroy_process_group()


def run_once(bed, n: int, backend: str, args: argparse.Namespace, out: Path, port: int) -> dict:
    """One torchrun per host of the worker; rank 0's record."""
    from inaproto.credentials import CONTROLLER_ENV, JOB_SECRET_ENV, new_secret
    from topologies.experiments import testbed

    hosts = [f"h{i}" for i in range(1, n + 1)]
    addrs = [a[0] for a in bed.host_addresses(hosts)]
    record = out / f"{backend}-n{n}-{port}.json"
    secret = new_secret()
    procs = []
    for i, (host, ip) in enumerate(zip(hosts, addrs)):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addrs[0]}:{port}", "--rdzv-id", f"{backend}-{port}",
                "--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", ip, str(Path(__file__).resolve()),
                "--worker", "--backend", backend, "--elements", str(args.elements), "--iterations",
                str(args.iterations), "--warmup", str(args.warmup), "--out", str(record)]
        env = {**testbed.AGENT_ENV, "GLOO_SOCKET_IFNAME": bed.net.host(host).defaultIntf().name,
               CONTROLLER_ENV: bed.controller_address, JOB_SECRET_ENV: secret}
        log = (out / f"{backend}-n{n}-{port}-{host}.log").open("w")
        procs.append(bed.net.popen(host, argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=str(out)))
    try:
        for host, p in zip(hosts, procs):
            if p.wait(timeout=1800) != 0:
                raise RuntimeError(f"{backend} n={n} {host}: exit {p.returncode}; see {out}/{backend}-n{n}-{port}-{host}.log")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return json.loads(record.read_text())


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def fmt(s: dict, scale: float = 1.0, unit: str = "s") -> str:
    return f"{s['median'] * scale:.3f} {unit} [{s['min'] * scale:.3f}-{s['max'] * scale:.3f}]"


def bench(args: argparse.Namespace) -> dict:
    from inaproto import wire
    from topologies.experiments import testbed
    from topologies.experiments.aggregate import framed_ina_ring_ratio, ina_wire_seconds, ring_wire_seconds
    from topologies.topos import StarTopo

    out_root = Path(args.out_dir or tempfile.mkdtemp(prefix="torch-bench-"))
    results: dict = {"elements": args.elements, "bw_mbps": args.bw, "rtt_ms": args.rtt_ms, "points": []}
    nbytes = args.elements * 4
    for n in args.workers:
        out = out_root / f"n{n}"
        out.mkdir(parents=True, exist_ok=True)
        runs: dict[str, list[float]] = {b: [] for b in BACKENDS}
        granted: dict[str, set] = {b: set() for b in BACKENDS}
        load = []
        port = RDZV_PORT
        with testbed.Testbed(StarTopo(n, bw=args.bw, rtt_ms=args.rtt_ms), run_dir=out / "bed", agent_timeout=1800) as bed:
            for rep in range(args.repetitions):
                for backend in BACKENDS if rep % 2 == 0 else BACKENDS[::-1]:
                    port += 1
                    load.append(os.getloadavg()[0])
                    rec = run_once(bed, n, backend, args, out, port)
                    runs[backend].append(statistics.median(rec["calls"]))
                    granted[backend].add(rec["granted"])
                    print(f"n={n} {backend} run {rep + 1}: median {runs[backend][-1]:.3f} s of {rec['calls']}",
                          flush=True)
        ina, gloo = spread(runs["ina"]), spread(runs["gloo"])
        point = {
            "workers": n, "ina_s": ina, "gloo_s": gloo, "granted": {b: sorted(g) for b, g in granted.items()},
            "ina_wire_s": ina_wire_seconds(nbytes, args.bw), "ring_wire_s": ring_wire_seconds(nbytes, n, args.bw),
            "framed_ideal_ratio": framed_ina_ring_ratio(n),
            "ina_gloo_ratio": spread([a / b for a, b in zip(runs["ina"], runs["gloo"])]),
            "load": spread(load), "frame_bytes": wire.INA_FRAME_LEN,
        }
        point["ina_wire_ratio"] = ina["median"] / point["ina_wire_s"]
        point["gloo_wire_ratio"] = gloo["median"] / point["ring_wire_s"]
        results["points"].append(point)
        print(f"n={n}: ina {fmt(ina)} ({point['ina_wire_ratio']:.3f} x its framed wire time "
              f"{point['ina_wire_s']:.3f} s), gloo {fmt(gloo)} ({point['gloo_wire_ratio']:.3f} x the ring's "
              f"{point['ring_wire_s']:.3f} s); ina/gloo {fmt(point['ina_gloo_ratio'], unit='')} against the framed "
              f"ideal {point['framed_ideal_ratio']:.3f}; load {fmt(point['load'], unit='')}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="torch_bench.py", description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="2,4,8", help="worker counts, e.g. 2,4,8")
    p.add_argument("--elements", type=int, default=256 * 1024, help="float32 elements per all-reduce")
    p.add_argument("--iterations", type=int, default=3, help="timed calls per run")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls first")
    p.add_argument("--repetitions", type=int, default=3, help="runs per backend, alternating")
    p.add_argument("--bw", type=float, default=2.0, help="every link, Mbit/s")
    p.add_argument("--rtt-ms", type=float, default=10.0, help="round trip between each worker and the switch")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--out-dir", help="logs and per-run records (default: a temporary folder)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    try:
        args.workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        p.error(f"--workers takes numbers separated by commas, got {args.workers!r}")
    if os.geteuid() != 0:
        p.error("needs root (Mininet)")
    if importlib.util.find_spec("torch") is None:
        print("torch_bench.py: PyTorch is not installed (make install adds it); nothing to measure")
        return 0
    bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
