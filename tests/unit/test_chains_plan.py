"""controller/chains.py: Rina's ring planned from a leaf-spine topology and a grant, installed into pipeline
models of every switch, gives every worker the exact sum of every partition (frames carried over the links)."""
from __future__ import annotations

import numpy as np
import pytest

from controller.chains import job_state, plan_rina
from controller.p4entity import Schema
from controller.policies import SlotRange
from controller.programming import SwitchProgrammer
from controller.store import Job
from controller.topology import Topology
from inaproto import admission_pb2 as pb
from inaproto import wire
from inaproto.job_entries import TransitEntry
from inaproto.rina_ring import host_copy_port
from inaproto.scapy_layer import INA
from p4src.ina_model import InaPipeline
from p4src.p4info import load_p4info
from tests.targets import Worker, dissect, gradient

JOB = 3


def _leaf_spine(racks: int, per_rack: int, ina: dict[str, bool] | None = None, own_ips: bool = False) -> Topology:
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


def _job(topo: Topology, slots: dict[str, int]) -> Job:
    req = pb.RegisterJobRequest(name="j")
    placement = []
    for wid, (name, h) in enumerate(sorted(topo.hosts.items())):
        req.workers.append(pb.Worker(worker_id=wid, ip=h.ip, udp_port=40000 + wid, mac=h.mac, host=name))
        placement.append((wid, h.switch, h.port))
    ranges = tuple(sorted((sw, SlotRange(8 * i, n)) for i, (sw, n) in enumerate(sorted(slots.items()))))
    return Job(JOB, 1, req, tuple(placement), 0.0, 1, "rina", "", ranges)


def test_every_rack_ina_members_are_the_switches_with_power_of_two_partitions():
    topo = _leaf_spine(2, 4)
    plan = plan_rina(topo, _job(topo, {"tor0": 8, "tor1": 8}))
    assert [m.switch for m in plan.members] == ["tor0", "tor1"] and all(m.is_switch for m in plan.members)
    assert {m.member_id for m in plan.members} == {31, 30}
    assert plan.partition_slots == 4 and set(plan.transit) == {"spine"}
    (p0, p1) = plan.chains["tor0"].chains
    assert (p0.slot_prefix, p0.prefix_len, p0.chain_end, p0.num_upstream) == (0, 14, 1, 1)
    assert (p1.slot_prefix, p1.prefix_len, p1.chain_end, p1.num_upstream) == (4, 14, 0, 0)


def test_a_rack_without_ina_joins_as_host_members_and_none_without_any_switch_member():
    topo = _leaf_spine(2, 2, {"tor1": False})
    plan = plan_rina(topo, _job(topo, {"tor0": 8}))
    assert [(m.is_switch, m.workers) for m in plan.members] == [(True, (0, 1)), (False, (2,)), (False, (3,))]
    # sizes from the hops' framed costs: the switch member, next to both INA-frame hops, gets the most
    # (unequal partitions interleave: a worker's consecutive chunks spread over every chain; one entry per slot)
    assert plan.ring.sizes == (4, 2, 2) and plan.num_slots == 8 and plan.partition_slots == 1
    assert plan.ring.slot_partitions == (0, 1, 2, 0, 0, 1, 2, 0)
    assert [c.match for c in plan.chains["tor0"].chains] == [(JOB, (s, 16)) for s in (0, 3, 4, 7, 1, 5, 2, 6)]
    assert plan_rina(topo, _job(topo, {})) is None
    assert plan_rina(topo, _job(topo, {"tor0": 2})) is None  # fewer slots than partitions: the plain ring


def _gradient(job: Job, wid: int, port: int, slot: int, lanes: np.ndarray, worker_id: int | None = None) -> bytes:
    """Worker ``wid``'s gradient from the addresses it registered (what the ingress binding checks)."""
    w = job.request.workers[wid]
    pkt = dissect(gradient(Worker(wid if worker_id is None else worker_id, port), JOB, slot, lanes, seq=1, generation=1))
    pkt.src, pkt["IP"].src, pkt["UDP"].sport = w.mac, w.ip, w.udp_port
    del pkt["IP"].chksum, pkt["UDP"].chksum
    return bytes(pkt)


def _install(topo: Topology, job: Job, plan) -> dict[str, InaPipeline]:
    schema = Schema(load_p4info())
    pipes = {}
    for sw in topo.switches:
        p = pipes[sw] = InaPipeline()
        for e in topo.forwarding(sw, schema)[0]:
            p.insert_entry(e.table, e.match, e.action, e.params)
        if sw in plan.chains:
            job_state(job, sw).insert_into(p)
            plan.chains[sw].insert_into(p)
        if sw in plan.transit:
            t = plan.transit[sw]
            p.insert_entry(t.table, t.match, t.action, t.params)
    return pipes


def _run(topo: Topology, pipes: dict[str, InaPipeline], sends: list[tuple[str, int, bytes]],
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


@pytest.mark.parametrize("own_ips", [False, True], ids=["shared-switch-ip", "own-switch-ips"])
@pytest.mark.parametrize("racks,per_rack", [(2, 4), (4, 2), (3, 2)])
def test_rina_over_every_ina_rack_gives_exact_sums(racks, per_rack, own_ips):
    """With its own INA address a switch member is addressed there (routed by the topology), so no result a
    worker gets carries that worker's own address as its source (its kernel would drop it as a martian)."""
    topo = _leaf_spine(racks, per_rack, own_ips=own_ips)
    job = _job(topo, {f"tor{r}": 16 for r in range(racks)})
    plan = plan_rina(topo, job)
    pipes = _install(topo, job, plan)
    rng = np.random.default_rng(racks)
    slots = range(plan.num_slots)
    totals = {s: np.zeros(wire.LANES, np.int64) for s in slots}
    sends = []
    for wid, sw, port in job.placement:
        for s in slots:
            v = rng.integers(-(2**20), 2**20, size=wire.LANES).astype(np.int32)
            totals[s] += v
            sends.append((sw, port, _gradient(job, wid, port, s, v)))
    delivered = _run(topo, pipes, sends)
    for wid, sw, port in job.placement:
        got = {p[INA].slot: p for p in delivered.pop((sw, port))}
        assert sorted(got) == list(slots)
        for s, pkt in got.items():
            assert pkt[INA].msg_type == wire.MsgType.RESULT and pkt[INA].worker_id == wid
            if own_ips:
                assert pkt["IP"].src == topo.switches[sw].switch_ip != job.request.workers[wid].ip
            assert pkt[INA].lanes == [int(x) for x in totals[s].astype(np.int32)]
    assert not delivered
    # each partition: R - 1 partials and R - 1 passed-on final sums cross the spine
    r = len(plan.members)
    partials = sum(pipes[m.switch].counters["MyIngress.ina_partials"][JOB] for m in plan.members)
    assert partials == (r - 1) * len(slots)


def test_programmer_adds_a_rina_jobs_chain_entries():
    topo = _leaf_spine(2, 2)
    job = _job(topo, {"tor0": 8, "tor1": 8})
    plan = plan_rina(topo, job)
    on = SwitchProgrammer(topo, {})
    tor = on.expected("tor0", {JOB: job})
    chains = [e for e in tor.entries.values() if e.table == "MyIngress.ina_chain"]
    assert sorted(e.match for e in chains) == sorted(c.match for c in plan.chains["tor0"].chains)
    assert set(tor.groups) == {JOB + 1, JOB + 257, JOB + 513}
    assert [e.table for e in on.expected("spine", {JOB: job}).entries.values() if e.table.startswith("MyIngress.ina")] == \
        ["MyIngress.ina_transit"]
    assert on.tables("tor0")[-3:] == ["MyIngress.ina_transit", "MyIngress.ina_chain", "MyIngress.ina_job"]
    # ingress binding: the other rack's member (partials) and tor0's own id (final sums) on tor0's uplink, port 3
    links = {e.match: e.params for e in tor.entries.values() if e.action == "MyIngress.bind_link"}
    assert links == {(JOB, m.member_id): (3, wire.INA_UDP_PORT, 3, wire.INA_UDP_PORT) for m in plan.members}


@pytest.mark.parametrize("racks,per_rack,plain", [(2, 4, {"tor1"}), (4, 2, {"tor1", "tor3"}), (2, 2, {"tor0"})])
def test_rina_with_racks_without_ina_hosts_keep_their_own_copy(racks, per_rack, plain):
    """Racks without INA: each worker there is a ring member whose copy is the program's model in its agent
    (HOST_PORT its own gradients and results, NETWORK_PORT the rest); their switches only route."""
    from controller.chains import HOST_PORT, NETWORK_PORT

    topo = _leaf_spine(racks, per_rack, {t: False for t in plain})
    job = _job(topo, {f"tor{r}": 16 for r in range(racks) if f"tor{r}" not in plain})
    plan = plan_rina(topo, job)
    assert len(plan.members) == (racks - len(plain)) + len(plain) * per_rack
    pipes = _install(topo, job, plan)
    for t in plain:  # a switch without INA: a plain router for these frames
        e = plan.transit.get(t) or TransitEntry(JOB)
        pipes[t].insert_entry(e.table, e.match, e.action, e.params)
    links = {}
    own_id = {}
    for wid, (own, chain) in plan.hosts.items():
        p = pipes[f"host{wid}"] = InaPipeline()
        own.insert_into(p)
        chain.insert_into(p)
        own_id[wid] = own.workers[0].worker_id
        sw, port = next((s, pt) for w, s, pt in job.placement if w == wid)
        links[(sw, port)] = (f"host{wid}", NETWORK_PORT)
    rng = np.random.default_rng(7)
    slots = range(plan.num_slots)
    totals = {s: np.zeros(wire.LANES, np.int64) for s in slots}
    sends, where = [], {}
    for wid, sw, port in job.placement:
        at = (f"host{wid}", HOST_PORT) if wid in plan.hosts else (sw, port)
        where[wid] = at
        for s in slots:
            v = rng.integers(-(2**20), 2**20, size=wire.LANES).astype(np.int32)
            totals[s] += v
            sends.append((*at, _gradient(job, wid, port, s, v, own_id.get(wid))))
    delivered = _run(topo, pipes, sends, links)
    for wid, at in where.items():
        got = {p[INA].slot: p for p in delivered.pop(at)}
        assert sorted(got) == list(slots)
        for s, pkt in got.items():
            assert pkt[INA].msg_type == wire.MsgType.RESULT
            assert pkt[INA].lanes == [int(x) for x in totals[s].astype(np.int32)]
    assert not delivered


def test_ring_rule_from_grant_facts_alone():
    from inaproto.rina_ring import Rack, ring_of

    ring = ring_of([Rack("b", (4, 5), 0, True), Rack("a", (0, 1, 2), 24, True), Rack("c", (3,), 9, False)])
    assert [(m.member_id, m.is_switch, m.workers) for m in ring.members] == \
        [(31, True, (0, 1, 2)), (4, False, (4,)), (5, False, (5,)), (3, False, (3,))]
    assert ring.sizes == (11, 6, 1, 6) and (ring.partition_slots, ring.prefix_len, ring.num_slots) == (1, 16, 24)
    assert ring.blocks(2) == [(8, 16)] and ring.partition_of(8) == 2 and ring.partition_of(6) == 3
    assert ring.blocks(0) == [(s, 16) for s in (0, 3, 4, 7, 9, 12, 14, 16, 19, 20, 23)]
    assert ring_of([Rack("a", (0, 1), 24, True), Rack("b", (2,), 8, True)]).sizes == (4, 4)  # all switches: 2^k each
    assert ring.upstream(0, 3) == () and ring.upstream(1, 3) == (31,)
    assert not ring.passes_final_on(2, 3) and ring.passes_final_on(3, 3)
    assert ring_of([Rack("a", (0, 1), 8, True)]) is None  # one member: single-switch INA
    assert ring_of([Rack("a", (0,), 0, True), Rack("b", (1,), 0, False)]) is None  # no INA slots: the ring
