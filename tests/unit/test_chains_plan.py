"""controller/chains.py: Rina's ring planned from a leaf-spine topology and a grant, installed into pipeline
models of every switch, gives every worker the exact sum of every partition (frames carried over the links)."""
from __future__ import annotations

import numpy as np
import pytest

from controller.chains import plan_rina
from controller.programming import SwitchProgrammer
from inaproto import wire
from inaproto.job_entries import TransitEntry
from inaproto.scapy_layer import INA
from p4src.ina_model import InaPipeline
from tests.support.plans import PLAN_JOB, carry, install_plan, leaf_spine, placed_job, plan_gradient

JOB = PLAN_JOB


def test_every_rack_ina_members_are_the_switches_with_power_of_two_partitions():
    topo = leaf_spine(2, 4)
    plan = plan_rina(topo, placed_job(topo, {"tor0": 8, "tor1": 8}))
    assert [m.switch for m in plan.members] == ["tor0", "tor1"] and all(m.is_switch for m in plan.members)
    assert {m.member_id for m in plan.members} == {31, 30}
    assert plan.partition_slots == 4 and set(plan.transit) == {"spine"}
    (p0, p1) = plan.chains["tor0"].chains
    assert (p0.slot_prefix, p0.prefix_len, p0.chain_end, p0.num_upstream) == (0, 14, 1, 1)
    assert (p1.slot_prefix, p1.prefix_len, p1.chain_end, p1.num_upstream) == (4, 14, 0, 0)


def test_a_rack_without_ina_joins_as_host_members_and_none_without_any_switch_member():
    topo = leaf_spine(2, 2, {"tor1": False})
    plan = plan_rina(topo, placed_job(topo, {"tor0": 8}))
    assert [(m.is_switch, m.workers) for m in plan.members] == [(True, (0, 1)), (False, (2,)), (False, (3,))]
    # sizes from the hops' framed costs: the switch member, next to both INA-frame hops, gets the most
    # (unequal partitions interleave: a worker's consecutive chunks spread over every chain; one entry per slot)
    assert plan.ring.sizes == (4, 2, 2) and plan.num_slots == 8 and plan.partition_slots == 1
    assert plan.ring.slot_partitions == (0, 1, 2, 0, 0, 1, 2, 0)
    assert [c.match for c in plan.chains["tor0"].chains] == [(JOB, (s, 16)) for s in (0, 3, 4, 7, 1, 5, 2, 6)]
    assert plan_rina(topo, placed_job(topo, {})) is None
    assert plan_rina(topo, placed_job(topo, {"tor0": 2})) is None  # fewer slots than partitions: the plain ring


@pytest.mark.parametrize("own_ips", [False, True], ids=["shared-switch-ip", "own-switch-ips"])
@pytest.mark.parametrize("racks,per_rack", [(2, 4), (4, 2), (3, 2)])
def test_rina_over_every_ina_rack_gives_exact_sums(racks, per_rack, own_ips):
    """With its own INA address a switch member is addressed there (routed by the topology), so no result a
    worker gets carries that worker's own address as its source (its kernel would drop it as a martian)."""
    topo = leaf_spine(racks, per_rack, own_ips=own_ips)
    job = placed_job(topo, {f"tor{r}": 16 for r in range(racks)})
    plan = plan_rina(topo, job)
    pipes = install_plan(topo, plan, job)
    rng = np.random.default_rng(racks)
    slots = range(plan.num_slots)
    totals = {s: np.zeros(wire.LANES, np.int64) for s in slots}
    sends = []
    for wid, sw, port in job.placement:
        for s in slots:
            v = rng.integers(-(2**20), 2**20, size=wire.LANES).astype(np.int32)
            totals[s] += v
            sends.append((sw, port, plan_gradient(job, wid, port, s, v)))
    delivered = carry(topo, pipes, sends)
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
    topo = leaf_spine(2, 2)
    job = placed_job(topo, {"tor0": 8, "tor1": 8})
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

    topo = leaf_spine(racks, per_rack, {t: False for t in plain})
    job = placed_job(topo, {f"tor{r}": 16 for r in range(racks) if f"tor{r}" not in plain})
    plan = plan_rina(topo, job)
    assert len(plan.members) == (racks - len(plain)) + len(plain) * per_rack
    pipes = install_plan(topo, plan, job)
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
            sends.append((*at, plan_gradient(job, wid, port, s, v, own_id.get(wid))))
    delivered = carry(topo, pipes, sends, links)
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
