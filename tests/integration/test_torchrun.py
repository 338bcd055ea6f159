"""examples/torchrun_train.py across hosts (root): torchrun --nnodes 2 in two Mininet hosts behind ina-switch.

The rendezvous (torchrun's c10d store) listens on h1's address inside the network namespaces, every
worker's agent joins the INA job at the real controller, the gradients go through the switch, and all
four workers (two per host) end with the same model. Behaviour, not timing.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("mininet")
pytest.importorskip("torch")

from inaproto.commands import REPO
from inaproto.credentials import JOB_SECRET_ENV, new_secret
from topologies.experiments import testbed
from topologies.topos import StarTopo

SCRIPT = REPO / "examples" / "torchrun_train.py"
RDZV_PORT = 29411


@pytest.mark.slow  # two torchrun launches of two workers each, over 30 s
def test_torchrun_two_hosts_two_workers_each_through_ina(tmp_path) -> None:
    out = tmp_path / "summary.json"
    procs: list[subprocess.Popen] = []
    secret = new_secret()  # the job's secret, shared by its four workers through the environment
    with testbed.Testbed(StarTopo(2), run_dir=tmp_path, agent_timeout=300) as bed:
        (h1_ip, _, _), (h2_ip, _, _) = bed.host_addresses(["h1", "h2"])
        try:
            for host, ip in (("h1", h1_ip), ("h2", h2_ip)):
                intf = bed.net.host(host).defaultIntf().name
                argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{h1_ip}:{RDZV_PORT}", "--rdzv-id", "tr-int",
                        # the namespaces share the machine's host name, so say which node hosts the store
                        "--rdzv-conf", f"is_host={int(host == 'h1')}", "--local-addr", ip, str(SCRIPT), "--controller", bed.controller_address,
                        "--job-name", "torchrun-int", "--epochs", "1", "--steps", "6", "--eval-every", "3",
                        "--global-batch", "64", "--json", str(out)]
                log = (tmp_path / f"torchrun-{host}.log").open("w")
                env = {**testbed.AGENT_ENV, "GLOO_SOCKET_IFNAME": intf, JOB_SECRET_ENV: secret}
                procs.append(bed.net.popen(host, argv, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env, cwd=str(tmp_path)))
            for host, p in zip(("h1", "h2"), procs):
                rc = p.wait(timeout=300)
                assert rc == 0, f"{host}: exit {rc}\n" + (tmp_path / f"torchrun-{host}.log").read_text()[-4000:]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 4 and summary["backend"] == "ina" and summary["steps"] == 6
    assert summary["same_model_on_every_rank"]
    assert summary["asynchronous_hook"] and summary["buckets_per_step"] >= 2
