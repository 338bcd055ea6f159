"""Agents on Rina's chains: with every rack INA-capable each worker is plain INA towards its rack's switch over
the ring's partitions, and the switches (models behind UDP, linked to each other) carry the ring: exact sums,
also under loss. The entries are the ones controller/chains.py computes (tests/unit/test_chains_plan.py)."""
from __future__ import annotations

import numpy as np
import pytest

from host_agent.options import AgentOptions, StreamOptions
from inaproto.job_entries import ChainHop, ChainLink, WorkerAddress, chain_entries, job_entries
from inaproto.rina_ring import Rack, host_copy_port, ring_of
from softswitch.udp import Faults, _mac_bytes
from tests.udp_switch import LocalCluster, quantised_sum

OPTIONS = AgentOptions(stream=StreamOptions(op_timeout=20.0))
JOB_ID = 1  # the fake controller's first job
SLOTS = 8


def _install_chains(cl: LocalCluster, slots: dict[str, int] | None = None) -> None:
    """What SwitchProgrammer(chains=True) writes, for the UDP switches (partials and final sums go to the next
    member: a rack's switch socket, or a host member's copy in its agent at ``host_copy_port``)."""
    racks = sorted(cl.switches)
    slots = slots or {r: SLOTS for r in racks if cl.switches[r] is not None}
    workers = {r: [w for i, w in enumerate(cl.spec.workers) if cl.racks[i] == r] for r in racks}
    by_id = {w.worker_id: w for w in cl.spec.workers}
    for sw in cl.switches.values():
        if sw is None:
            continue
        for match in [m for m in sw.pipeline.table("MyIngress.ina_chain").entries if m[0] == JOB_ID]:
            sw.pipeline.delete_entry("MyIngress.ina_chain", match)
    ring = ring_of(Rack(r, tuple(w.worker_id for w in workers[r]), slots.get(r, 0), cl.switches[r] is not None)
                   for r in racks)
    if ring is None:
        return
    n = len(ring.members)

    def address(m) -> tuple[str, int]:
        if m.is_switch:
            return cl.switches[m.switch].address
        w = by_id[m.member_id]
        return (w.ip, host_copy_port(w.udp_port))

    for i, m in enumerate(ring.members):
        if not m.is_switch:
            continue  # its agent keeps its copy (host_agent/host_member.py)
        sw = cl.switches[m.switch]
        nxt_m, prv = ring.members[(i + 1) % n], ring.members[(i - 1) % n]
        nxt = ChainHop(nxt_m.member_id, sw.attach(*address(nxt_m)), _mac_bytes(0), *address(nxt_m))
        job = job_entries(JOB_ID, [WorkerAddress(w.worker_id, sw.attach(w.ip, w.udp_port), _mac_bytes(w.worker_id),
                                                 w.ip, w.udp_port) for w in workers[m.switch]],
                          base_slot=0, num_slots=slots[m.switch], generation=0)
        parts = ring.chain_partitions(i, nxt)
        link = ChainLink(sw.attach(*address(prv)), address(prv)[1])  # the predecessor's socket
        entries = chain_entries(job, m.member_id, nxt, parts, {prv.member_id: link, m.member_id: link})
        for g in entries.groups:
            sw.pipeline.set_multicast_group(g.group_id, list(g.replicas))
        for e in entries.table_entries:
            table = sw.pipeline.table(e.table)
            write = sw.pipeline.modify_entry if e.match in table.entries else sw.pipeline.insert_entry
            write(e.table, e.match, e.action, e.params)


@pytest.mark.parametrize("racks", [["r1", "r1", "r2", "r2"], ["r1", "r2", "r2", "r3", "r3", "r3"]], ids=["2x2", "3-racks"])
@pytest.mark.parametrize("faults", [None, Faults(drop=0.02, duplicate=0.01)], ids=["clean", "lossy"])
def test_every_rack_ina_workers_get_exact_sums_through_the_chains(racks, faults):
    rng = np.random.default_rng(len(racks))
    inputs = [(rng.standard_normal(2000) * 3).astype(np.float32) for _ in racks]
    with LocalCluster(racks, slots=SLOTS, backend="rina", options=OPTIONS, faults=faults, seed=5) as cl:
        _install_chains(cl)

        def work(agent):
            return [agent.allreduce(inputs[agent.rank]) for _ in range(2)], agent.stats

        out = cl.run(work)
        partials = sum(sw.counter("MyIngress.ina_partials", JOB_ID) for sw in cl.switches.values())
    expected = quantised_sum(inputs)
    for results, stats in out:
        for r in results:
            np.testing.assert_array_equal(r, expected)
        assert stats.ring_ops == 0
    assert partials > 0


def test_a_rack_losing_its_slots_mid_job_falls_back_to_plain_membership_and_back():
    """Generation by generation the ring follows the slots: two switch members while both racks have slots, r2's
    workers host members (each keeping its copy) while r2 has none, two switch members again; every worker plain
    INA towards its switch or its copy throughout, every chunk counted once (exact)."""
    steps = [{"slots": {"r1": SLOTS, "r2": 0}}, {"slots": {"r1": SLOTS, "r2": SLOTS}}]
    out = _regranted(["r1", "r1", "r2", "r2"], steps, calls=20, every=150, seed=9)
    for _, stats in out:
        kinds = [kind for _, kind, _ in stats.generation_history]
        assert len(kinds) >= 3 and set(kinds) == {"ina"} and stats.ring_ops == 0


def _regranted(racks: list[str], steps: list[dict], *, calls: int, every: int, seed: int) -> list:
    """Every worker's (results, stats) of ``calls`` all-reduces while the fake controller applies ``steps`` (and
    writes the chains of every generation it grants, as SwitchProgrammer does); every sum checked exact."""
    from tests.unit.test_agent_realloc import _assert_exact, _run_with_steps

    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(3000).astype(np.float32) for _ in racks]
    with LocalCluster(racks, slots=SLOTS, backend="rina", options=OPTIONS) as cl:
        _install_chains(cl)
        program = cl.fake._program

        def program_with_chains(job, slots, bases, reason):
            program(job, slots, bases, reason)
            _install_chains(cl, slots)

        cl.fake._program = program_with_chains
        out, applied = _run_with_steps(cl, inputs, calls=calls, steps=steps, every=every)
    _assert_exact(out, inputs)
    assert len(applied) == len(steps)
    return out


def test_rina_on_chains_moves_to_the_ring_and_back_exactly():
    """All slots revoked mid-job: no chain, every worker on the ring; slots back: chains again, exact throughout."""
    steps = [{"slots": {"r1": SLOTS, "r2": 0}}, {"slots": {"r1": 0, "r2": 0}}, {"slots": {"r1": SLOTS, "r2": SLOTS}}]
    out = _regranted(["r1", "r1", "r2", "r2", "r2"], steps, calls=30, every=200, seed=4)
    kinds = [kind for _, kind, _ in out[0][1].generation_history]
    assert kinds[0] == "ina" and "ring" in kinds and kinds[-1] == "ina"


def test_an_overflow_on_the_chains_is_recovered_exactly():
    """Racks r1 (3 workers) and r2 (2) are switch members, r3 (2) has no INA: its workers are host members; large
    values of r2's workers overflow the int32 sum, which every worker recovers."""
    racks = ["r1", "r1", "r1", "r2", "r2", "r3", "r3"]
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal(3000) * 5).astype(np.float32) for _ in racks]
    inputs[3][100:160] = inputs[4][100:160] = 30000.0
    with LocalCluster(racks, ina_racks={"r1", "r2"}, slots=SLOTS, backend="rina", options=OPTIONS) as cl:
        _install_chains(cl)
        out = cl.run(lambda agent: ([agent.allreduce(inputs[agent.rank]) for _ in range(2)], agent.stats,
                                    agent.host_copy is not None))
    expected = quantised_sum(inputs)
    for i, (results, stats, copy) in enumerate(out):
        assert all(r.tobytes() == expected.tobytes() for r in results)
        assert stats.overflow_chunks > 0 and stats.ring_ops == 0 and copy == (racks[i] == "r3")


def test_a_plans_slots_carry_their_chain_one_class_per_chain() -> None:
    """On chains the plan gives every rack (a switch's, a host member's own) the chain of each slot: one class per
    chain for the sender's RACK and timers (5 at 2 x 4 with one INA rack, where the interleaved partitions made
    each of the 33 slots a class of its own before), the same chains where the partitions are contiguous."""
    from host_agent.grant import Grant, SwitchGrant, chain_ring, plan_for

    def grant(slots: int, ina2: bool) -> Grant:
        return Grant(job_id=4, generation=1, backend="rina", ina_port=47000, switches=(
            SwitchGrant("r1", "10.0.1.254", num_slots=slots, worker_ids=(0, 1, 2, 3)),
            SwitchGrant("r2", "10.0.2.254" if ina2 else "", num_slots=slots if ina2 else 0, worker_ids=(4, 5, 6, 7))))

    half = grant(33, False)
    ring = chain_ring(half, hosts=True)
    assert ring is not None and len(ring.members) == 5 and ring.partition_slots == 1
    for w in (0, 5):
        plan = plan_for(half, range(8), "rina")
        rack = next(r for r in plan.racks if w in r.worker_ids)
        assert rack.slot_chains == ring.slot_partitions and len(rack.slot_chains) == rack.num_slots == 33
        assert rack.chains == 5
    full = grant(16, True)
    rack = plan_for(full, range(8), "rina").racks[0]
    assert rack.slot_chains == (0,) * 8 + (1,) * 8 and rack.chains == 2
    plain = plan_for(Grant(job_id=4, generation=1, backend="ina", ina_port=47000, switches=(
        SwitchGrant("r1", "10.0.1.254", num_slots=8, worker_ids=(0, 1)),)), range(2), "auto").racks[0]
    assert plain.slot_chains == () and plain.chains == 1


def test_rack_compares_chunks_of_one_chain_only() -> None:
    """On chains, partition 1's results come round a longer chain than partition 0's: a result of a later
    partition-0 chunk is no evidence that an earlier partition-1 chunk was lost (it was, before the classes:
    a third of the chunks resent at 2 x 4), but a later partition-1 result is."""
    from host_agent.congestion import CongestionWindow
    from host_agent.flight import Flight
    from host_agent.rtt import RttEstimator
    from host_agent.stats import StreamStats

    K = 8
    est = RttEstimator(0.05, 0.010, 1.0)
    est.sample(0.010)
    classes = (np.arange(K) % 4) // 2  # 4 slots, 2 partitions of 2: chunks 0,1,4,5 short; 2,3,6,7 long
    fl = Flight(K, 0, est, CongestionWindow(initial=K), 4, StreamStats(), classes=classes)
    got = np.zeros(K, dtype=np.uint8)
    queued = bytearray(K)
    fl.sent(0, 6, 1.000)
    for i in (0, 1):
        got[i] = 1
        fl.delivered(i, 1.010)
    fl.sent(6, 8, 1.010)
    got[4] = 1
    fl.delivered(4, 1.011)  # short chain: chunks 2 and 3 (long chain, sent before it) are not late
    assert fl.lost(got, 2, 8, 2.0, queued) == []
    got[3] = 1
    fl.delivered(3, 1.030)  # long chain: chunk 2, sent before 3 on the same chain, is
    assert fl.lost(got, 2, 8, 2.0, queued) == [2]


@pytest.mark.parametrize("racks,ina", [(["r1", "r1", "r2", "r2"], {"r1"}), (["r1", "r2", "r2", "r3", "r3"], {"r2"})],
                         ids=["2x2-half", "3-racks-one"])
@pytest.mark.parametrize("faults", [None, Faults(drop=0.02, duplicate=0.01)], ids=["clean", "lossy"])
def test_workers_of_racks_without_ina_are_host_members_with_their_own_copy(racks, ina, faults):
    """Racks without INA: each worker there is a ring member keeping its copy of the chain (in a child process of
    its agent); every worker is plain INA (towards its switch or its copy) and gets the exact sum, also under loss
    on the switches."""
    rng = np.random.default_rng(len(racks) + 1)
    inputs = [(rng.standard_normal(2000) * 3).astype(np.float32) for _ in racks]
    with LocalCluster(racks, ina_racks=ina, slots=SLOTS, backend="rina", faults=faults, seed=5, options=OPTIONS) as cl:
        _install_chains(cl)

        def work(agent):
            results = [agent.allreduce(inputs[agent.rank]) for _ in range(2)]
            copy = agent.host_copy
            report = copy.report() if copy is not None else {"frames": 0, "bundles_sent": 0, "bundled": 0}
            return (results, agent.stats, agent.plan.kind, report["frames"] > 0, (report["bundles_sent"], report["bundled"]))

        out = cl.run(work)
        partials = sum(sw.counter("MyIngress.ina_partials", JOB_ID) for sw in cl.switches.values() if sw)
    expected = quantised_sum(inputs)
    for i, (results, stats, kind, copied, _) in enumerate(out):
        for r in results:
            np.testing.assert_array_equal(r, expected)
        assert kind == "ina" and stats.ring_ops == 0
        assert copied == (racks[i] not in ina)
    assert partials > 0
    # host members next to each other exchange runs (inaproto.rina_runs): fewer datagrams than the payloads they carry
    bundles, payloads = (sum(o[4][k] for o in out) for k in (0, 1))
    assert 0 < bundles < payloads
