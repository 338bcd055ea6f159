"""Plans over whole topologies for tests: a leaf-spine, a job placed on it, every switch's pipeline model with
the plan's entries (Rina's chains, controller/chains.py; trees, controller/trees.py), and frames carried over
the trunks between the models until the network is quiet."""
from __future__ import annotations

import numpy as np

from controller.chains import RinaPlan, job_state
from controller.p4entity import Schema
from controller.policies import SlotRange
from controller.store import Job
from controller.topology import Topology
from controller.trees import TreePlan
from inaproto import admission_pb2 as pb
from inaproto import wire
from inaproto.rina_ring import host_copy_port
from p4src.ina_model import InaPipeline
from p4src.p4info import load_p4info
from tests.support.frames import Worker, dissect, gradient

__all__ = ["PLAN_JOB", "carry", "install_plan", "leaf_spine", "placed_job", "plan_gradient"]

PLAN_JOB = 3


def leaf_spine(racks: int, per_rack: int, ina: dict[str, bool] | None = None, own_ips: bool = False) -> Topology:
    switches = {"spine": {}}
    hosts, links = {}, []
    for r in range(racks):
        tor = f"tor{r}"
        switches[tor] = {"ina": (ina or {}).get(tor, True)}
        if own_ips:  # every ToR its own INA address (as ina-exp's leaf-spine): chains go to it
            switches[tor] |= {"switch_ip": f"10.0.{r}.253", "switch_mac": f"02:00:00:00:{r:02x}:fe"}
        links.append([f"{tor}-p{per_rack + 1}", f"spine-p{r + 1}"])
        for k in range(per_rack):
            h = f"h{r}{k}"
            hosts[h] = {"ip": f"10.0.{r}.{k + 1}/16", "mac": f"02:00:00:00:{r:02x}:{k + 1:02x}"}
            links.append([h, f"{tor}-p{k + 1}"])
    return Topology.from_dict({"switches": switches, "hosts": hosts, "links": links})


def placed_job(topo: Topology, slots: dict[str, int]) -> Job:
    req = pb.RegisterJobRequest(name="j")
    placement = []
    for wid, (name, h) in enumerate(sorted(topo.hosts.items())):
        req.workers.append(pb.Worker(worker_id=wid, ip=h.ip, udp_port=40000 + wid, mac=h.mac, host=name))
        placement.append((wid, h.switch, h.port))
    ranges = tuple(sorted((sw, SlotRange(8 * i, n)) for i, (sw, n) in enumerate(sorted(slots.items()))))
    return Job(PLAN_JOB, 1, req, tuple(placement), 0.0, 1, "rina", "", ranges)


def plan_gradient(job: Job, wid: int, port: int, slot: int, lanes: np.ndarray, worker_id: int | None = None) -> bytes:
    """Worker ``wid``'s gradient from the addresses it registered (what the ingress binding checks)."""
    w = job.request.workers[wid]
    pkt = dissect(gradient(Worker(wid if worker_id is None else worker_id, port), PLAN_JOB, slot, lanes, seq=1, generation=1))
    pkt.src, pkt["IP"].src, pkt["UDP"].sport = w.mac, w.ip, w.udp_port
    del pkt["IP"].chksum, pkt["UDP"].chksum
    return bytes(pkt)


def install_plan(topo: Topology, plan: RinaPlan | TreePlan, job: Job | None = None) -> dict[str, InaPipeline]:
    """A pipeline model per switch of ``topo`` with its forwarding and the plan's entries: a tree's own job
    states (``plan.states``), or ``job``'s state on each of Rina's chain members, and the transit entries."""
    schema = Schema(load_p4info())
    pipes = {}
    for sw in topo.switches:
        p = pipes[sw] = InaPipeline()
        for e in topo.forwarding(sw, schema)[0]:
            p.insert_entry(e.table, e.match, e.action, e.params)
        if sw in plan.chains:
            (plan.states[sw] if isinstance(plan, TreePlan) else job_state(job, sw)).insert_into(p)
            plan.chains[sw].insert_into(p)
        transit = plan.transit if isinstance(plan, RinaPlan) else {}
        if sw in transit:
            t = transit[sw]
            p.insert_entry(t.table, t.match, t.action, t.params)
    return pipes


def carry(topo: Topology, pipes: dict[str, InaPipeline], sends: list[tuple[str, int, bytes]],
         links: dict | None = None) -> dict:
    """Carry frames over the topology's trunks (and ``links``) until quiet; frames to other ports are returned
    per (node, port)."""
    peer = {}
    for a, b in (links or {}).items():
        peer[a], peer[b] = b, a
    for sw, ports in topo.trunks.items():
        for port, nb in ports.items():
            peer[(sw, port)] = (nb, next(p for p, x in topo.trunks[nb].items() if x == sw))
    queue = list(sends)
    delivered: dict = {}
    while queue:
        sw, port, frame = queue.pop(0)
        for out_port, out in pipes[sw].process(port, frame):
            if (sw, out_port) in peer:
                to = peer[(sw, out_port)]
                if sw.startswith("host"):  # the agent sends what its copy emits from the copy's socket
                    out = out[:34] + host_copy_port(40000 + int(sw[4:])).to_bytes(2, "big") + out[36:]
                if to[0].startswith("host"):  # and hands what that socket got to its copy as INA, from INA's port
                    ina = wire.INA_UDP_PORT.to_bytes(2, "big")
                    out = out[:34] + ina + ina + out[38:]
                queue.append((*to, out))
            else:
                delivered.setdefault((sw, out_port), []).append(dissect(out))
    return delivered
