"""The soak's network (``bench/soak.py --switch process``, its default): the real ``ina-switch`` process in a
network namespace with its own ``--fault-*`` options, each worker an ``ina`` agent *process* in a namespace
of its own joined to the switch by a veth pair, as on K worker machines.

Addressing (as topologies/plan.py's rack 1): worker host ``h<p>`` on switch port ``p`` is ``10.0.1.p/24``,
MAC ``02:00:00:00:01:pp``; the switch's INA address (and the hosts' gateway, never answering ARP: static
entries) is ``10.0.1.254`` / ``02:00:00:00:01:fe``. The controller runs in the root namespace; it reaches
the switch through a TCP forward into the switch namespace (topologies.switch_process), and the agents
reach it through a relay listening on 127.0.0.1:<its port> inside every host namespace.

A worker process (``python bench/soak_net.py CONFIG.json``) all-reduces until the deadline vote ends its
job, checks every result bit for bit, and writes its tally to ``CONFIG.json``'s ``result`` path.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np

from host_agent.fixedpoint import dequantize, quantize
from inaproto import wire

SUBNET = "10.0.1"
SWITCH_IP = f"{SUBNET}.254"
SWITCH_MAC = "02:00:00:00:01:fe"
WORKER_PORT = 41000  # every worker has a namespace of its own: the same UDP/TCP port everywhere
SCALE = float(2**16)


def inputs(seed: int, job: int, call: int, workers: int, elements: int) -> list[np.ndarray]:
    """Every worker's array of one all-reduce, derived from a shared seed (so each worker knows the sum)."""
    rng = np.random.default_rng((seed, job, call))
    return [rng.standard_normal(elements).astype(np.float32) for _ in range(workers)]


def exact_sum(arrays: list[np.ndarray]) -> np.ndarray:
    """The exact fixed-point sum an all-reduce of ``arrays`` must return, bit for bit."""
    total = np.sum(np.stack([quantize(a, SCALE).astype(np.int64) for a in arrays]), axis=0)
    return dequantize(total, SCALE)


def host_ip(port: int) -> str:
    return f"{SUBNET}.{port}"


def host_mac(port: int) -> str:
    return f"02:00:00:00:01:{port:02x}"


@dataclass(frozen=True)
class SwitchFaults:
    """``ina-switch --fault-*``: each INA packet into and out of the switch (direction both)."""

    loss: float
    duplicate: float
    reorder: float
    seed: int

    def args(self) -> list[str]:
        return ["--fault-drop", str(self.loss), "--fault-dup", str(self.duplicate),
                "--fault-reorder", str(self.reorder), "--fault-seed", str(self.seed)]


class SwitchBed:
    """``ina-switch`` in a namespace with ``n_hosts`` worker namespaces; ``close()`` removes everything."""

    def __init__(self, n_hosts: int, folder: Path, faults: SwitchFaults, controller_port: int) -> None:
        from topologies.netns import Network, TcpRelay
        from topologies.switch_process import SwitchNetwork, SwitchProcess

        if not 1 <= n_hosts <= 253:
            raise ValueError(f"{n_hosts} workers: the soak's one subnet holds 1..253")
        self.network = Network("soak")
        self.relay: TcpRelay | None = None
        try:
            self.net = SwitchNetwork(self.network, range(1, n_hosts + 1), separate_hosts=True)
            for port, (ns, iface) in self.net.hosts.items():
                ns.ip("link", "set", iface, "address", host_mac(port))
                ns.ip("addr", "add", f"{host_ip(port)}/24", "dev", iface)
                ns.ip("neigh", "replace", SWITCH_IP, "lladdr", SWITCH_MAC, "dev", iface, "nud", "permanent")
                for other in self.net.hosts:
                    if other != port:
                        ns.ip("neigh", "replace", host_ip(other), "lladdr", host_mac(other), "dev", iface, "nud", "permanent")
            self.switch = SwitchProcess(self.net, folder, core_args=faults.args())
            listeners = []
            for ns, _ in self.net.hosts.values():
                with ns.entered():
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", controller_port))
                s.listen(64)
                s.setblocking(False)
                listeners.append(s)
            self.relay = TcpRelay(listeners, ("127.0.0.1", controller_port), name="soak-controller-relay")
        except BaseException:
            self.close()
            raise

    def topology(self) -> dict:
        """topology.json for the controller: hosts ``h<p>`` on ``s1-p<p>``, the switch through its forward."""
        doc: dict = {"hosts": {}, "switches": {"s1": {"grpc": self.switch.address, "device_id": self.switch.device_id,
                                                     "pool": wire.NUM_SLOTS, "switch_ip": SWITCH_IP,
                                                     "switch_mac": SWITCH_MAC}}, "links": []}
        for port in self.net.hosts:
            doc["hosts"][f"h{port}"] = {"ip": f"{host_ip(port)}/24", "mac": host_mac(port)}
            doc["links"].append([f"h{port}", f"s1-p{port}"])
        return doc

    def start_worker(self, port: int, config: Path, log: Path):
        """The worker process of host ``h<port>`` in its namespace (stopped with the bed)."""
        from topologies.netns import Process

        ns, _ = self.net.hosts[port]
        return self.network.track(Process([sys.executable, os.path.abspath(__file__), str(config)], log, namespace=ns))

    def switch_log(self) -> str:
        return self.switch.process.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        self.network.close()  # the switch and the workers first, then the namespaces


def write_config(path: Path, config: dict) -> None:
    """A worker's configuration (it holds the job's secret: mode 0600, never a command line)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        json.dump(config, fh)


def run_worker(config_path: str) -> int:
    """One worker: all-reduce fresh inputs until a worker of the job sees the deadline; write the tally."""
    from host_agent.agent import Agent, AgentOptions, bind_worker_sockets
    from host_agent.grant import JobSpec, Worker
    from host_agent.options import StreamOptions

    c = json.loads(Path(config_path).read_text())
    i, k, n = c["worker"], c["job"], len(c["hosts"])
    workers = tuple(Worker(w, host_ip(p), WORKER_PORT, host_mac(p), f"h{p}") for w, p in enumerate(c["hosts"]))
    spec = JobSpec(c["name"], workers, backend="auto", tensor_elements=c["elements"], requested_slots=c["slots"],
                   secret=c["secret"])
    opts = AgentOptions(stream=StreamOptions(op_timeout=60.0), rendezvous_timeout=60.0, close_timeout=15.0)
    tally = {"allreduces": 0, "wrong": 0, "error": ""}
    agent = None
    try:
        udp, tcp = bind_worker_sockets(host_ip(c["hosts"][i]), WORKER_PORT)
        agent = Agent(spec, i, controller=c["controller"], sock=udp, listener=tcp, options=opts)
        call = 0
        while True:
            arrays = inputs(c["seed"], k, call, n, c["elements"])
            vote = np.float32(1.0 if time.time() < c["deadline"] else 0.0)
            out = agent.allreduce(np.append(arrays[i], vote))
            tally["allreduces"] += 1
            if out[:-1].tobytes() != exact_sum(arrays).tobytes():
                tally["wrong"] += 1
            if out[-1] < n - 0.5:  # someone has seen the deadline: this was the last call
                break
            call += 1
    except Exception as exc:  # a failed call: the parent counts its chunks lost  # noqa: BLE001
        tally["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if agent is not None:
            s = agent.stats
            tally.update(backend=str(agent.backend), chunks=s.chunks, retransmits=s.retransmits,
                         early_resends=s.early_resends, timeouts=s.timeouts, spurious_resends=s.spurious_resends,
                         resyncs=s.resyncs, replayed_chunks=s.replayed_chunks, generations=len(s.generation_history))
            agent.close()
        Path(c["result"]).write_text(json.dumps(tally))
    return 0 if not tally["error"] else 1


if __name__ == "__main__":
    sys.exit(run_worker(sys.argv[1]))
