"""Agents on Rina's chains: with every rack INA-capable each worker is plain INA towards its rack's switch over
the ring's partitions, and the switches (models behind UDP, on loopback) carry the ring: exact sums, also under
loss. The entries are the controller's own (topologies/loopback.py runs the controller core)."""
from __future__ import annotations

import numpy as np
import pytest

from host_agent.options import AgentOptions, StreamOptions
from softswitch.udp import Faults
from tests.support.realloc import admit_step, assert_exact, release_step, run_with_steps
from topologies.loopback import LoopbackCluster, exact_sum

OPTIONS = AgentOptions(stream=StreamOptions(op_timeout=20.0))
SLOTS = 8


@pytest.mark.parametrize("racks", [["r1", "r1", "r2", "r2"], ["r1", "r2", "r2", "r3", "r3", "r3"]], ids=["2x2", "3-racks"])
@pytest.mark.parametrize("faults", [None, Faults(drop=0.02, duplicate=0.01)], ids=["clean", "lossy"])
def test_every_rack_ina_workers_get_exact_sums_through_the_chains(racks, faults):
    rng = np.random.default_rng(len(racks))
    inputs = [(rng.standard_normal(2000) * 3).astype(np.float32) for _ in racks]
    with LoopbackCluster(racks, slots=SLOTS, backend="rina", options=OPTIONS, faults=faults, seed=5) as cl:
        def work(agent):
            return [agent.allreduce(inputs[agent.rank]) for _ in range(2)], agent.stats, agent.job_id

        out = cl.run(work)
        partials = sum(sw.counter("MyIngress.ina_partials", out[0][2]) for sw in cl.switches.values())
        out = [o[:2] for o in out]
    expected = exact_sum(inputs)
    for results, stats in out:
        for r in results:
            np.testing.assert_array_equal(r, expected)
        assert stats.ring_ops == 0
    assert partials > 0


def test_a_rack_losing_its_slots_mid_job_falls_back_to_plain_membership_and_back():
    """Generation by generation the ring follows the slots: two switch members while both racks have slots, r2's
    workers host members (each keeping its copy) while r2 has none, two switch members again; every worker plain
    INA towards its switch or its copy throughout, every chunk counted once (exact)."""
    racks = ["r1", "r1", "r2", "r2"]
    rng = np.random.default_rng(9)
    inputs = [rng.standard_normal(3000).astype(np.float32) for _ in racks]
    # a higher-priority job takes r2's pool, then leaves
    steps = [admit_step("b", "r2", SLOTS), release_step("b")]
    with LoopbackCluster(racks, slots=SLOTS, pool=SLOTS, policy="priority", backend="rina", options=OPTIONS) as cl:
        out, applied = run_with_steps(cl, inputs, calls=20, steps=steps, every=150)
    assert_exact(out, inputs)
    assert len(applied) == len(steps)
    for _, stats in out:
        kinds = [kind for _, kind, _ in stats.generation_history]
        assert len(kinds) >= 3 and set(kinds) == {"ina"} and stats.ring_ops == 0


def test_rina_on_chains_moves_to_the_ring_and_back_exactly():
    """All slots revoked mid-job: no chain, every worker on the ring; slots back: chains again, exact throughout.
    Higher-priority jobs take r2's pool, then r1's, and leave in turn."""
    racks = ["r1", "r1", "r2", "r2", "r2"]
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal(3000).astype(np.float32) for _ in racks]
    steps = [admit_step("b", "r2", SLOTS), admit_step("c", "r1", SLOTS), release_step("c", "b")]
    with LoopbackCluster(racks, slots=SLOTS, pool=SLOTS, policy="priority", backend="rina", options=OPTIONS) as cl:
        out, applied = run_with_steps(cl, inputs, calls=30, steps=steps, every=200)
    assert_exact(out, inputs)
    assert len(applied) == len(steps)
    kinds = [kind for _, kind, _ in out[0][1].generation_history]
    assert kinds[0] == "ina" and "ring" in kinds and kinds[-1] == "ina"


def test_an_overflow_on_the_chains_is_recovered_exactly():
    """Racks r1 (3 workers) and r2 (2) are switch members, r3 (2) has no INA: its workers are host members; large
    values of r2's workers overflow the int32 sum, which every worker recovers."""
    racks = ["r1", "r1", "r1", "r2", "r2", "r3", "r3"]
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal(3000) * 5).astype(np.float32) for _ in racks]
    inputs[3][100:160] = inputs[4][100:160] = 30000.0
    with LoopbackCluster(racks, ina_racks={"r1", "r2"}, slots=SLOTS, backend="rina", options=OPTIONS) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(inputs[agent.rank]) for _ in range(2)], agent.stats,
                                    agent.host_copy is not None))
    expected = exact_sum(inputs)
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
    with LoopbackCluster(racks, ina_racks=ina, slots=SLOTS, backend="rina", faults=faults, seed=5, options=OPTIONS) as cl:
        def work(agent):
            results = [agent.allreduce(inputs[agent.rank]) for _ in range(2)]
            copy = agent.host_copy
            report = copy.report() if copy is not None else {"frames": 0, "bundles_sent": 0, "bundled": 0}
            return (results, agent.stats, agent.plan.kind, report["frames"] > 0, (report["bundles_sent"], report["bundled"]),
                    agent.job_id)

        out = cl.run(work)
        partials = sum(sw.counter("MyIngress.ina_partials", out[0][5]) for sw in cl.switches.values() if sw)
    expected = exact_sum(inputs)
    for i, (results, stats, kind, copied, _, _) in enumerate(out):
        for r in results:
            np.testing.assert_array_equal(r, expected)
        assert kind == "ina" and stats.ring_ops == 0
        assert copied == (racks[i] not in ina)
    assert partials > 0
    # host members next to each other exchange runs (inaproto.rina_runs): fewer datagrams than the payloads they carry
    bundles, payloads = (sum(o[4][k] for o in out) for k in (0, 1))
    assert 0 < bundles < payloads
