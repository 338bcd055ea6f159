"""The backend "ina" under torchrun in Mininet (root): through ina-switch and the real controller, against gloo.

examples/torchrun_train.py trains the digits CNN with ``--backend ina`` (``$INA_CONTROLLER``: the testbed's
controller; every rank's agent joins one INA job) and with ``--backend gloo``, on the same shaped links, one after
the other: ``torchrun --nproc-per-node 4`` on one host, and ``torchrun --nnodes 2`` (two ranks per host) across two
hosts. Behaviour is asserted (the grant is INA, every rank ends with the same model, held-out accuracy within
0.5 points of gloo's); step times and the all-reduce's share of a step are printed beside each other, never
asserted. ``flock /tmp/ina-integration.lock`` around the run (docs/agent.md, "PyTorch").
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mininet")
pytest.importorskip("torch")

from inaproto.commands import REPO
from inaproto.credentials import CONTROLLER_ENV, JOB_SECRET_ENV, new_secret
from topologies.experiments import testbed
from topologies.topos import StarTopo

SCRIPT = REPO / "examples" / "torchrun_train.py"
RDZV_PORT = 29411
LINKS = {"bw": 2.0, "rtt_ms": 10.0}  # experiment 1's: Mbit/s per link (htb), round trip to the switch (its delay)
TRAIN = ("--model", "cnn", "--epochs", "4", "--eval-every", "22", "--global-batch", "64", "--lr", "0.1",
         "--bucket-cap-mb", "25", "--timeout", "120")  # DDP's own bucket size


def torchrun(bed, hosts: list[str], nproc: int, backend: str, seed: int, out: Path, port: int, *,
             train: tuple[str, ...] = TRAIN, controller: bool = True, name: str = "") -> dict:
    """One training: a torchrun per host (the first hosts the rendezvous); rank 0's summary. Without
    ``controller``, the backend "ina" runs the agents' ring among the ranks."""
    addrs = [a[0] for a in bed.host_addresses(hosts)]
    name = name or backend
    summary = out / f"{name}-s{seed}.json"
    secret = new_secret()  # the job's secret, shared by its ranks through the environment
    procs = []
    for i, (host, ip) in enumerate(zip(hosts, addrs)):
        if len(hosts) == 1:  # static rendezvous on the host's own address: the agents bind it
            launch = ["--nnodes", "1", "--master-addr", ip, "--master-port", str(port)]
        else:  # the namespaces share the machine's host name: say which node hosts the store, and each one's address
            launch = ["--nnodes", str(len(hosts)), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addrs[0]}:{port}",
                      "--rdzv-id", f"{name}-{seed}", "--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", ip]
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *launch, str(SCRIPT),
                *train, "--backend", backend, "--seed", str(seed), "--json", str(summary)]
        env = {**testbed.AGENT_ENV, "GLOO_SOCKET_IFNAME": bed.net.host(host).defaultIntf().name, JOB_SECRET_ENV: secret}
        env = {**env, CONTROLLER_ENV: bed.controller_address} if controller else env
        log = (out / f"{name}-s{seed}-{host}.log").open("w")
        procs.append(bed.net.popen(host, argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=str(out)))
    try:
        for host, p in zip(hosts, procs):
            rc = p.wait(timeout=600)
            assert rc == 0, f"{name} seed {seed} {host}: exit {rc}\n" + \
                (out / f"{name}-s{seed}-{host}.log").read_text()[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return json.loads(summary.read_text())


def compare(bed, hosts: list[str], nproc: int, seeds: list[int], out: Path) -> list[tuple[dict, dict]]:
    pairs = []
    for k, seed in enumerate(seeds):
        ina = torchrun(bed, hosts, nproc, "ina", seed, out, RDZV_PORT + 2 * k)
        gloo = torchrun(bed, hosts, nproc, "gloo", seed, out, RDZV_PORT + 2 * k + 1)
        pairs.append((ina, gloo))
        print(f"seed {seed}: accuracy ina {ina['final_accuracy']:.4f} gloo {gloo['final_accuracy']:.4f}; step "
              f"ina {ina['step_seconds_median'] * 1e3:.1f} ms gloo {gloo['step_seconds_median'] * 1e3:.1f} ms; "
              f"all-reduce share ina {ina['allreduce_share']:.2f} gloo {gloo['allreduce_share']:.2f}")
    for ina, gloo in pairs:
        assert ina["granted"] == "ina" and gloo["granted"] == "gloo"
        assert ina["world_size"] == gloo["world_size"] == len(hosts) * nproc
        assert ina["same_model_on_every_rank"] and gloo["same_model_on_every_rank"]
        assert abs(ina["final_accuracy"] - gloo["final_accuracy"]) <= 0.005, (ina["final_accuracy"],
                                                                               gloo["final_accuracy"])
    return pairs


@pytest.mark.slow
def test_torchrun_four_ranks_on_one_host_through_ina(tmp_path) -> None:
    with testbed.Testbed(StarTopo(1, **LINKS), run_dir=tmp_path, agent_timeout=300) as bed:
        compare(bed, ["h1"], 4, [0], tmp_path)


@pytest.mark.slow
def test_torchrun_two_hosts_through_ina_matches_gloo_over_three_seeds(tmp_path) -> None:
    with testbed.Testbed(StarTopo(2, **LINKS), run_dir=tmp_path, agent_timeout=300) as bed:
        compare(bed, ["h1", "h2"], 2, [0, 1, 2], tmp_path)


@pytest.mark.bmv2
@pytest.mark.slow
def test_torchrun_through_bmv2_trains_the_rings_model_bit_for_bit(tmp_path) -> None:
    """Four ranks on one host behind BMv2 (the P4 program as p4c compiled it) train the same model as the agents'
    ring, bit for bit: block floating point's integer sums are exact on the switch."""
    if not testbed.BMV2_PROGRAM.exists():
        if shutil.which("p4c-bm2-ss") is None:
            pytest.skip("p4c-bm2-ss is not on PATH (make p4)")
        subprocess.run(["make", "-C", str(REPO), "p4", f"PY={sys.executable}", "STAMP="], check=True,
                       capture_output=True, timeout=600)
    short = ("--model", "cnn", "--epochs", "1", "--steps", "6", "--eval-every", "3", "--global-batch", "64",
             "--bucket-cap-mb", "25", "--timeout", "300")
    with testbed.Testbed(StarTopo(1), run_dir=tmp_path, target="bmv2", agent_timeout=600) as bed:
        ina = torchrun(bed, ["h1"], 4, "ina", 0, tmp_path, RDZV_PORT + 20, train=short)
        ring = torchrun(bed, ["h1"], 4, "ina", 0, tmp_path, RDZV_PORT + 21, train=short, controller=False, name="ring")
    assert ina["granted"] == "ina" and ring["granted"] == "ring"
    assert ina["same_model_on_every_rank"] and ring["same_model_on_every_rank"] and ina["steps"] == 6
    assert ina["param_digest"] == ring["param_digest"]
