"""examples/torchrun_train.py as users start it (torchrun, tiny size): backend "ina" against gloo, allocation.

Each run is ``torchrun --nproc-per-node N`` of the script: with backend "ina" and no controller the ranks'
agents run their ring among themselves; with ``$INA_CONTROLLER`` naming the controller core over the pipeline
model behind UDP (``topologies.loopback.LoopbackCluster``) they go through the switch; with gloo it is PyTorch's
own. The runs go side by side to save wall time.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from inaproto.credentials import CONTROLLER_ENV, JOB_SECRET_ENV
from topologies.loopback import LoopbackCluster

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "torchrun_train.py"
TINY = ("--epochs", "1", "--steps", "12", "--eval-every", "6", "--global-batch", "64", "--timeout", "60")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path: Path, name: str, *args: str, nproc: int = 2, cluster: LoopbackCluster | None = None
              ) -> tuple[subprocess.Popen, Path]:
    """One torchrun of the script; with ``cluster``, through its switch: the rendezvous on host h0's address (the
    agents bind the address they reach it from), ``$INA_CONTROLLER`` its controller."""
    out = tmp_path / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if k != CONTROLLER_ENV}  # the agents' ring, whatever the shell has
    launch = ["--standalone"]
    if cluster is not None:
        launch = ["--nnodes", "1", "--master-addr", cluster.host_ip("h0"), "--master-port", str(_free_port())]
        env.update({CONTROLLER_ENV: cluster.address, JOB_SECRET_ENV: cluster.spec.secret})
    argv = [sys.executable, "-m", "torch.distributed.run", *launch, "--nproc-per-node", str(nproc), str(SCRIPT),
            *TINY, "--json", str(out), "--save-params", str(tmp_path / f"{name}.npz"), *args]
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env), out


def _finish(runs: dict, tmp_path: Path) -> dict:
    results = {}
    try:
        for name, (proc, out) in runs.items():
            rc = proc.wait(timeout=300)
            assert rc == 0, f"{name} exited {rc}:\n" + (tmp_path / f"{name}.log").read_text()[-3000:]
            results[name] = json.loads(out.read_text())
    finally:
        for proc, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_usage_errors_are_one_line_and_exit_2() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "torchrun" in r.stderr.splitlines()[-1]
    r = subprocess.run([sys.executable, str(SCRIPT), "--backend", "nccl"], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 2 and "--backend" in r.stderr.splitlines()[-1]


@pytest.mark.slow  # two torchrun launches of three ranks each: over 30 s on two cores
def test_backend_ina_trains_the_model_gloo_trains(tmp_path) -> None:
    """Three ranks, unequal shares of the batch (64 = 22 + 21 + 21, each loss scaled by n * b_i / B): the ina
    backend (block floating point over the agents' ring) ends at gloo's parameters within 1e-5 and at its
    accuracy; every rank holds the same model; the all-reduce's share of a step is measured on both."""
    runs = {"ina": _torchrun(tmp_path, "ina", nproc=3), "gloo": _torchrun(tmp_path, "gloo", "--backend", "gloo", nproc=3)}
    res = _finish(runs, tmp_path)
    assert res["ina"]["granted"] == "ring" and res["gloo"]["granted"] == "gloo"
    assert res["ina"]["batch_sizes"] == [22, 21, 21]
    for r in res.values():
        assert r["same_model_on_every_rank"] and r["steps"] == 12 and r["buckets_per_step"] >= 2
        assert 0 <= r["allreduce_share"] <= 1 and 0 <= r["overlap"] <= 1
    ina, gloo = np.load(tmp_path / "ina.npz"), np.load(tmp_path / "gloo.npz")
    assert sorted(ina.files) == sorted(gloo.files) == ["step_0", "step_12", "step_6"]
    for key in ina.files:  # at the same steps, the parameters of gloo's float all-reduce
        rel = np.linalg.norm(ina[key] - gloo[key]) / np.linalg.norm(gloo[key])
        assert rel < 1e-5, (key, rel)
    assert abs(res["ina"]["final_accuracy"] - res["gloo"]["final_accuracy"]) <= 0.01


@pytest.mark.slow  # two torchrun launches of two ranks each, through the controller and the switch model: over 30 s
def test_through_the_switch_equals_the_ring_bit_for_bit(tmp_path) -> None:
    """Block floating point sums integers exactly, so INA and the ring train the same model, bit for bit."""
    with LoopbackCluster(["s1", "s1"], slots=16) as cl:  # its sockets are not used: the ranks bind their own
        runs = {"ina": _torchrun(tmp_path, "ina", cluster=cl), "ring": _torchrun(tmp_path, "ring")}
        res = _finish(runs, tmp_path)
    assert res["ina"]["granted"] == "ina" and res["ring"]["granted"] == "ring"
    assert all(r["same_model_on_every_rank"] and r["steps"] == 12 for r in res.values())
    assert res["ina"]["param_digest"] == res["ring"]["param_digest"]
    assert res["ina"]["buckets_per_step"] >= 2 and 0 <= res["ina"]["overlap"] <= 1


def test_adaptive_allocation_shrinks_the_slow_workers_share(tmp_path) -> None:
    runs = {"adaptive": _torchrun(tmp_path, "adaptive", "--allocation", "adaptive", "--slowdown", "1,3",
                                  "--epochs", "3", "--steps", "0", "--global-batch", "240")}
    res = _finish(runs, tmp_path)["adaptive"]
    assert res["steps"] == 3 * (1437 // 240) and sum(res["batch_sizes"]) == 240
    assert res["batch_sizes"][1] < res["batch_sizes"][0], res["batch_sizes"]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc")
@pytest.mark.parametrize("backend", ["ina", "gloo"])
def test_the_process_group_is_gone_when_train_returns(tmp_path, backend: str) -> None:
    """No thread of the group outlives ``train`` (gloo's, the agent's): a group destroyed at interpreter teardown
    can abort the process (exit -6), and an agent thread left would keep it waiting."""
    probe = (
        "import os, runpy, sys\n"
        f"main = runpy.run_path({str(SCRIPT)!r})['main']\n"
        f"rc = main([*{list(TINY)!r}, '--backend', {backend!r}, '--allocation', 'static'])\n"
        "names = sorted(open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task'))\n"
        "print('rc', rc, 'threads', ','.join(names), flush=True)\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if k != "INA_CONTROLLER"}, "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.splitlines()[-1]
    assert last.startswith("rc 0 threads ") and not any(n in last for n in ("gloo", "ina-", "agent-")), last
