"""Train the same model through INA and with torch's own gloo float all-reduce, step for step, over several seeds.

    .venv/bin/python examples/ina_vs_gloo.py --seeds 0,1,2 --out results/ina-vs-gloo            # no root
    sudo .venv/bin/python examples/ina_vs_gloo.py --where mininet --out results/ina-vs-gloo     # Mininet

``--where local`` (default, no root): two ranks on one loopback host, INA through the P4 pipeline model behind
UDP and the controller core (``topologies.loopback.LoopbackCluster``). ``--where mininet``: a rack of two hosts
behind ina-switch with the real controller (``topologies`` Testbed), ``torchrun --nnodes 2`` with the rendezvous
on h1's address. For every seed the script runs ``examples/torchrun_train.py`` both ways at once: with gloo's
float32 all-reduce (the reference) and with the backend "ina" through the switch (block floating point). Every
run sees the same batches (equal allocation, same seed), so the parameters can be compared at the same steps.

Writes ``results.json`` (keys listed in docs/agent.md, "Numerics against gloo") and ``ina_vs_gloo.png``:
held-out accuracy per step and the relative parameter distance to gloo, medians over the seeds with
their min-max band.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from inaproto.credentials import CONTROLLER_ENV, JOB_SECRET_ENV, new_secret

SCRIPT = Path(__file__).resolve().parent / "torchrun_train.py"
VARIANTS = {"gloo": ("--backend", "gloo"), "ina": ("--backend", "ina")}


def launch_local(cluster, seed: int, name: str, extra: tuple[str, ...], port: int, out: Path,
                 train_args: list[str]) -> list:
    """torchrun --nproc-per-node 2 on the cluster's host h0 (its address is the rendezvous'); returns the process."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--master-addr", cluster.host_ip("h0"), "--master-port", str(port), str(SCRIPT),
            "--seed", str(seed), "--json", str(out / f"{name}-s{seed}.json"),
            "--save-params", str(out / f"{name}-s{seed}.npz"), *train_args, *extra]
    env = {**os.environ, CONTROLLER_ENV: cluster.address, JOB_SECRET_ENV: new_secret()}
    log = (out / f"{name}-s{seed}.log").open("w")
    return [subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(out),
                             env=env)]


def launch(bed, seed: int, name: str, extra: tuple[str, ...], port: int, out: Path, train_args: list[str]) -> list:
    """torchrun --nnodes 2 of the training script in h1 and h2; returns the two processes."""
    from topologies.experiments import testbed

    (h1_ip, _, _), (h2_ip, _, _) = bed.host_addresses(["h1", "h2"])
    secret = new_secret()  # the job's, the same on both hosts
    procs = []
    for host, ip in (("h1", h1_ip), ("h2", h2_ip)):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{h1_ip}:{port}", "--rdzv-id", f"{name}-{seed}",
                "--rdzv-conf", f"is_host={int(host == 'h1')}", "--local-addr", ip, str(SCRIPT),
                "--seed", str(seed), "--json", str(out / f"{name}-s{seed}.json"),
                "--save-params", str(out / f"{name}-s{seed}.npz"), *train_args, *extra]
        env = {**testbed.AGENT_ENV, "GLOO_SOCKET_IFNAME": bed.net.host(host).defaultIntf().name,
               CONTROLLER_ENV: bed.controller_address, JOB_SECRET_ENV: secret}
        log = (out / f"{name}-s{seed}-{host}.log").open("w")
        procs.append(bed.net.popen(host, argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=str(out)))
    return procs


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def analyse(out: Path, seeds: list[int], where: str) -> dict:
    runs = {(v, s): json.loads((out / f"{v}-s{s}.json").read_text()) for v in VARIANTS for s in seeds}
    params = {(v, s): np.load(out / f"{v}-s{s}.npz") for v in VARIANTS for s in seeds}
    steps = [p["step"] for p in runs[("gloo", seeds[0])]["curve"]]
    res: dict = {"seeds": seeds, "where": where, "steps": steps, "world_size": runs[("gloo", seeds[0])]["world_size"],
                 "backends": {v: runs[(v, seeds[0])]["backend"] for v in VARIANTS}, "final_accuracy": {},
                 "accuracy_gap_pp": {}, "param_distance": {}, "accuracy_curve": {}}
    for v in VARIANTS:
        res["final_accuracy"][v] = spread([runs[(v, s)]["final_accuracy"] for s in seeds])
        res["accuracy_curve"][v] = [spread([runs[(v, s)]["curve"][i]["accuracy"] for s in seeds]) for i in range(len(steps))]
        if v == "gloo":
            continue
        res["accuracy_gap_pp"][v] = spread([100 * (runs[(v, s)]["final_accuracy"] - runs[("gloo", s)]["final_accuracy"])
                                            for s in seeds])
        per_step = []
        for step in steps:
            key = f"step_{step}"
            per_step.append(spread([float(np.linalg.norm(params[(v, s)][key] - params[("gloo", s)][key])
                                          / np.linalg.norm(params[("gloo", s)][key])) for s in seeds]))
        res["param_distance"][v] = per_step
    res["seed_spread_pp"] = 100 * (res["final_accuracy"]["gloo"]["max"] - res["final_accuracy"]["gloo"]["min"])
    return res


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = res["steps"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    labels = {"gloo": "gloo float32 all-reduce", "ina": "backend ina (block floating point)"}
    colour = {"gloo": "tab:blue", "ina": "tab:orange"}
    for v, style in (("gloo", "-"), ("ina", "--")):
        c = res["accuracy_curve"][v]
        a.plot(steps, [p["median"] for p in c], style, color=colour[v], label=labels[v])
        a.fill_between(steps, [p["min"] for p in c], [p["max"] for p in c], color=colour[v], alpha=0.15)
    a.set_xlabel("step")
    a.set_ylabel("held-out accuracy")
    a.set_title(f"median of {len(res['seeds'])} seeds, band = min-max")
    a.legend()
    for v, style in (("ina", "--"),):
        d = res["param_distance"][v][1:]
        b.plot(steps[1:], [p["median"] for p in d], style, color=colour[v], label=labels[v])
        b.fill_between(steps[1:], [max(p["min"], 1e-12) for p in d], [p["max"] for p in d], color=colour[v], alpha=0.15)
    b.set_yscale("log")
    b.set_xlabel("step")
    b.set_ylabel("||params - gloo's|| / ||gloo's||")
    b.set_title("distance to gloo's model at the same step")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def wait_all(procs: list, seed: int, out: Path) -> None:
    try:
        for proc in procs:
            if proc.wait(timeout=900) != 0:
                raise SystemExit(f"ina_vs_gloo.py: a run of seed {seed} failed; logs in {out}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def run_all(where: str, seeds: list[int], out: Path, train_args: list[str]) -> None:
    t0 = time.monotonic()
    if where == "local":
        from topologies.loopback import LoopbackCluster

        with LoopbackCluster(["s1", "s1"], slots=64) as cl:
            for seed in seeds:
                procs = []
                for k, (name, extra) in enumerate(VARIANTS.items()):
                    procs += launch_local(cl, seed, name, extra, 29500 + 10 * seed + k, out, train_args)
                wait_all(procs, seed, out)
                print(f"seed {seed} done ({time.monotonic() - t0:.0f} s)", flush=True)
        return
    from topologies.experiments import testbed
    from topologies.topos import StarTopo

    with testbed.Testbed(StarTopo(2), run_dir=out / "testbed", agent_timeout=900) as bed:
        for seed in seeds:
            procs = []
            for k, (name, extra) in enumerate(VARIANTS.items()):
                procs += launch(bed, seed, name, extra, 29500 + 10 * seed + k, out, train_args)
            wait_all(procs, seed, out)
            print(f"seed {seed} done ({time.monotonic() - t0:.0f} s)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default="results/ina-vs-gloo")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--where", choices=("local", "mininet"), default="local")
    p.add_argument("--analyse-only", action="store_true", help="recompute results.json and the plot from --out")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    if len(seeds) < 1:
        p.error("--seeds needs at least one seed")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.analyse_only:
        run_all(args.where, seeds, out, ["--epochs", str(args.epochs), "--eval-every", "7"])
    res = analyse(out, seeds, args.where)
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    plot(res, out / "ina_vs_gloo.png")
    fa, gap = res["final_accuracy"], res["accuracy_gap_pp"]
    for v in VARIANTS:
        print(f"{v:9s} final held-out accuracy {fa[v]['median']:.4f} ({fa[v]['min']:.4f}-{fa[v]['max']:.4f})"
              + (f", gap to gloo {gap[v]['median']:+.2f} pp ({gap[v]['min']:+.2f}..{gap[v]['max']:+.2f}), "
                 f"final distance {res['param_distance'][v][-1]['median']:.2e}" if v in gap else ""))
    print(f"plot: {out / 'ina_vs_gloo.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
