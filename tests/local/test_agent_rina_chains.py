"""Agents on Rina's chains: with every rack INA-capable each worker is plain INA towards its rack's switch over
the ring's partitions, and the switches (models behind UDP, on loopback) carry the ring: exact sums, also under
loss. The entries are the controller's own (topologies/loopback.py runs the controller core)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from host_agent.agent import AgentOptions
from host_agent.stream import StreamOptions
from softswitch.udp import Faults
from tests.support.realloc import admit_step, assert_exact, release_step, run_with_steps
from topologies.loopback import LoopbackCluster, exact_sum

OPTIONS = AgentOptions(stream=StreamOptions(op_timeout=20.0, rina_chains=True))
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
        assert stats.broadcasts_sent == 0
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


def test_a_plans_slots_carry_their_chain_one_class_per_chain() -> None:
    """On chains the plan gives every rack (a switch's, a host member's own) the chain of each slot: one class per
    chain for the sender's RACK and timers (5 at 2 x 4 with one INA rack, where the interleaved partitions made
    each of the 33 slots a class of its own before), the same chains where the partitions are contiguous."""
    from host_agent.grant import Grant, SwitchGrant, chain_ring, plan_for

    def grant(slots: int, ina2: bool) -> Grant:
        return Grant(job_id=4, generation=1, backend="rina", chains=True, ina_port=47000, switches=(
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
    from host_agent.stream import StreamStats

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
@pytest.mark.parametrize("faults,bundle_frames,mode", [(None, 11, "thread"), (Faults(drop=0.02, duplicate=0.01), 11, "thread"),
                                                     (None, 1, "thread"), (None, 11, "process")],
                         ids=["clean", "lossy", "no-bundles", "own-process"])
def test_workers_of_racks_without_ina_are_host_members_with_their_own_copy(racks, ina, faults, bundle_frames, mode,
                                                                          monkeypatch):
    """Racks without INA: each worker there is a ring member keeping its copy of the chain in its agent; every
    worker is plain INA (towards its switch or its copy) and gets the exact sum, also under loss (on the switches
    and, lossy, on what the copies send: single frames and runs between host members alike); the copy runs in
    a thread of the agent or in a child process of its own."""
    from host_agent.host_member import CopyMode, _Copy

    if faults is not None:
        send_run, fault_rng = _Copy._send_run, np.random.default_rng(11)

        def faulty_send_run(self, data, size: int, count: int, dst) -> None:
            for j in range(count):  # each datagram of the run dropped or duplicated on its own
                x = fault_rng.random()
                if x < faults.drop:
                    continue
                for _ in range(2 if x > 1 - faults.duplicate else 1):
                    send_run(self, data[j * size : (j + 1) * size], size, 1, dst)

        monkeypatch.setattr(_Copy, "_send_run", faulty_send_run)
    rng = np.random.default_rng(len(racks) + 1)
    inputs = [(rng.standard_normal(2000) * 3).astype(np.float32) for _ in racks]
    with LoopbackCluster(racks, ina_racks=ina, slots=SLOTS, backend="rina", faults=faults, seed=5,
                      options=dataclasses.replace(OPTIONS, rina_bundle_frames=bundle_frames,
                                                  rina_copy=CopyMode(mode))) as cl:
        def work(agent):
            results = [agent.allreduce(inputs[agent.rank]) for _ in range(2)]
            copy = agent.host_copy
            report = copy.report() if copy is not None else {"frames": 0, "bundles_sent": 0, "bundled": 0}
            assert copy is None or copy.mode is CopyMode(mode)
            return (results, agent.stats, agent.plan.kind, report["frames"] > 0, (report["bundles_sent"], report["bundled"]),
                    agent.job_id)

        out = cl.run(work)
        partials = sum(sw.counter("MyIngress.ina_partials", out[0][5]) for sw in cl.switches.values() if sw)
    expected = exact_sum(inputs)
    for i, (results, stats, kind, copied, _, _) in enumerate(out):
        for r in results:
            np.testing.assert_array_equal(r, expected)
        assert kind == "ina" and stats.broadcasts_sent == 0 and stats.ring_ops == 0
        assert copied == (racks[i] not in ina)
    assert partials > 0
    # host members next to each other exchange runs (inaproto.rina_runs): fewer datagrams than the payloads they carry
    bundles, payloads = (sum(o[4][k] for o in out) for k in (0, 1))
    assert 0 < bundles < payloads if bundle_frames > 1 else 0 < bundles == payloads
