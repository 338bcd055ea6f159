"""Chains across switches (docs/switch.md, "Chains"): a switch's completed partial goes onward as one contribution,
the final sum comes back, is kept and multicast; loss is recovered end to end. Two and three switches, as a tree
and as Rina's ring of partitions. The test carries frames between the switches' linked ports, so the same cases
run on the model, on ina-switch and on BMv2."""
from __future__ import annotations

import numpy as np
import pytest

from inaproto import wire
from inaproto.job_entries import (
    ChainPartition,
    TransitEntry,
    WorkerAddress,
    chain_entries,
    job_entries,
)
from inaproto.scapy_layer import INA
from tests.support.fabric import CHAIN_JOB as JOB
from tests.support.fabric import L9, L10, MEMBER, NUM_SLOTS, Fabric, check_results, hop, install_member, two_switches
from tests.support.frames import Worker, dissect, gradient, random_lanes


def test_two_switches_partial_goes_on_final_comes_back_rounds_in_both_copies(switches):
    fabric, workers_at = two_switches(switches)
    rng = np.random.default_rng(1)
    for rnd in range(3):  # three rounds of slot 1: shadow copies 0, 1, 0
        seq, shadow = 1 + rnd, rnd % 2
        total = np.zeros(wire.LANES, np.int64)
        order = [(s, w) for s, ws in workers_at.items() for w in ws]
        if rnd == 1:
            order.reverse()  # the upstream partial after the local workers
        for s, w in order:
            v = random_lanes(rng)
            total += v
            fabric.send(s, w.port, gradient(w, JOB, 1, v, seq=seq, shadow=shadow))
        delivered = fabric.run()
        check_results(delivered, workers_at, {1: total.astype(np.int32)}, {1: seq})
        # one partial onward (worker_id = S0's member id), one final back (addressed to S0)
        kinds = [(s, dissect(f)[INA].msg_type, dissect(f)[INA].worker_id) for s, _, f in fabric.carried]
        assert sorted(kinds) == [(0, wire.MsgType.GRADIENT, MEMBER), (1, wire.MsgType.RESULT, MEMBER)]
        fabric.carried.clear()
    s0, s1 = fabric.switches
    assert s0.read_counter("MyIngress.ina_partials", JOB) == 3
    assert s1.read_counter("MyIngress.ina_partials", JOB) == 0
    assert s1.read_counter("MyIngress.ina_aggregated", JOB) == 9  # two workers and one partial per round
    assert s0.read_counter("MyEgress.ina_results", JOB) == 6
    assert s1.read_counter("MyEgress.ina_results", JOB) == 9  # its two workers and S0, per round


def test_lost_final_is_recovered_from_the_next_hop_by_a_retransmission(switches):
    fabric, workers_at = two_switches(switches)
    rng = np.random.default_rng(2)
    values = {w.wid: random_lanes(rng) for ws in workers_at.values() for w in ws}
    total = sum(v.astype(np.int64) for v in values.values()).astype(np.int32)
    for s, ws in workers_at.items():
        for w in ws:
            fabric.send(s, w.port, gradient(w, JOB, 0, values[w.wid], seq=1))
    delivered = fabric.run(drop=lambda s, port, f: s == 1)  # the final sum towards S0 is lost
    check_results(delivered, {1: workers_at[1]}, {0: total}, {0: 1})
    assert all(s != 0 for s, _ in delivered)
    # S0's worker 0 resends: S0 holds only its partial, so it sends that onward again; S1 has the final sum and
    # answers S0 with it; S0 keeps it and multicasts it to its workers.
    w = workers_at[0][0]
    fabric.send(0, w.port, gradient(w, JOB, 0, values[w.wid], seq=1, flags=wire.Flags.RETRANSMIT))
    fabric.carried.clear()
    delivered = fabric.run()
    check_results(delivered, {0: workers_at[0]}, {0: total}, {0: 1})
    kinds = sorted((s, dissect(f)[INA].msg_type, int(dissect(f)[INA].flags)) for s, _, f in fabric.carried)
    assert kinds == [(0, wire.MsgType.GRADIENT, int(wire.Flags.RETRANSMIT)), (1, wire.MsgType.RESULT, 0)]
    # now S0 holds the final sum: a further resend is answered by S0 itself
    fabric.carried.clear()
    fabric.send(0, w.port, gradient(w, JOB, 0, values[w.wid], seq=1, flags=wire.Flags.RETRANSMIT))
    delivered = fabric.run()
    assert not fabric.carried
    check_results(delivered, {0: [w]}, {0: total}, {0: 1})


def test_lost_partial_is_sent_again_when_a_local_worker_resends(switches):
    fabric, workers_at = two_switches(switches)
    rng = np.random.default_rng(3)
    values = {w.wid: random_lanes(rng) for ws in workers_at.values() for w in ws}
    total = sum(v.astype(np.int64) for v in values.values()).astype(np.int32)
    for s, ws in workers_at.items():
        for w in ws:
            fabric.send(s, w.port, gradient(w, JOB, 2, values[w.wid], seq=7, shadow=1))
    assert fabric.run(drop=lambda s, port, f: s == 0) == {}  # the partial is lost: nobody has a result
    w = workers_at[0][1]
    fabric.send(0, w.port, gradient(w, JOB, 2, values[w.wid], seq=7, shadow=1, flags=wire.Flags.RETRANSMIT))
    delivered = fabric.run()
    check_results(delivered, workers_at, {2: total}, {2: 7})
    assert fabric.switches[0].read_counter("MyIngress.ina_partials", JOB) == 2


def test_upstream_overflow_reaches_the_result(switches):
    fabric, workers_at = two_switches(switches)
    big = np.full(wire.LANES, 2**30 + 2**29, np.int64)
    for w in workers_at[0]:
        fabric.send(0, w.port, gradient(w, JOB, 0, big.astype(np.int32), seq=1))
    for w in workers_at[1]:
        fabric.send(1, w.port, gradient(w, JOB, 0, np.zeros(wire.LANES, np.int32), seq=1))
    delivered = fabric.run()
    wrapped = (big * 2).astype(np.int64).astype(np.uint32).view(np.int32)
    check_results(delivered, workers_at, {0: wrapped}, {0: 1}, flags=int(wire.Flags.OVERFLOW))


def test_three_switches_rina_ring_one_partition_per_member(switches):
    """Rina: members 0, 1, 2 in a ring (port 9 to the successor's port 10); partition p (slot p) starts after
    member p and ends at it, and its final sum travels the ring once more, stopping before member p again."""
    targets = switches(3)
    workers_at = {s: [Worker(2 * s, 1), Worker(2 * s + 1, 2)] for s in range(3)}
    for m in range(3):
        parts = []
        for p in range(3):
            first = m == (p + 1) % 3
            parts.append(ChainPartition(p, 16, () if first else (MEMBER + (m - 1) % 3,), m == p,
                                        () if m == (p - 1) % 3 else (hop((m + 1) % 3, 9),)))
        install_member(targets[m], workers_at[m], MEMBER + m, hop((m + 1) % 3, 9), parts,
                 {MEMBER + (m - 1) % 3: L10, MEMBER + m: L10}, base=8 * m)
    fabric = Fabric(targets, {(m, 9): ((m + 1) % 3, 10) for m in range(3)})
    rng = np.random.default_rng(4)
    totals = {p: np.zeros(wire.LANES, np.int64) for p in range(3)}
    for s, ws in workers_at.items():
        for w in ws:
            for p in range(3):
                v = random_lanes(rng)
                totals[p] += v
                fabric.send(s, w.port, gradient(w, JOB, p, v, seq=10 + p))
    delivered = fabric.run()
    check_results(delivered, workers_at, {p: t.astype(np.int32) for p, t in totals.items()}, {p: 10 + p for p in range(3)})
    # per partition: two partials (reduce-scatter) and two passed-on final sums (all-gather)
    assert sum(t.read_counter("MyIngress.ina_partials", JOB) for t in targets) == 6
    carried = sorted(dissect(f)[INA].msg_type for _, _, f in fabric.carried)
    assert carried == [wire.MsgType.GRADIENT] * 6 + [wire.MsgType.RESULT] * 6


def test_three_switches_tree_root_waits_for_both_children(switches):
    """A two-level tree: ToRs S0 and S1 (two workers each) send their partials to the root S2 (no workers of
    its own, ports 9 and 10), whose final sum goes back down to both and from each to its workers."""
    s0, s1, root = switches(3)
    w0, w1 = [Worker(0, 1), Worker(1, 2)], [Worker(2, 1), Worker(3, 2)]
    install_member(s0, w0, MEMBER, hop(2, 9), [ChainPartition(0, 0, (), False)], {MEMBER: L9})
    install_member(s1, w1, MEMBER + 1, hop(2, 9), [ChainPartition(0, 0, (), False)], {MEMBER + 1: L9})
    install_member(root, [], MEMBER + 2, None, [ChainPartition(0, 0, (MEMBER, MEMBER + 1), True, (hop(0, 9), hop(1, 10)))],
             {MEMBER: L9, MEMBER + 1: L10})
    fabric = Fabric([s0, s1, root], {(0, 9): (2, 9), (1, 9): (2, 10)})
    rng = np.random.default_rng(5)
    total = np.zeros(wire.LANES, np.int64)
    for s, ws in ((0, w0), (1, w1)):
        for w in ws:
            v = random_lanes(rng)
            total += v
            fabric.send(s, w.port, gradient(w, JOB, 3, v, seq=2))
    delivered = fabric.run()
    check_results(delivered, {0: w0, 1: w1}, {3: total.astype(np.int32)}, {3: 2})
    assert root.read_counter("MyIngress.ina_aggregated", JOB) == 2


def test_result_for_another_member_is_dropped_and_counted(switches):
    fabric, _workers_at = two_switches(switches)
    s1 = fabric.switches[1]
    w = Worker(MEMBER + 3, 9)
    s1.send(9, gradient(w, JOB, 0, np.zeros(wire.LANES, np.int32), seq=1, msg_type=wire.MsgType.RESULT))
    assert s1.receive() == []
    reason = int(wire.DropReason.NOT_RECIPIENT)
    assert s1.read_counter("MyIngress.ina_drops", reason) == 1
    assert s1.read_counter("MyIngress.ina_job_drops", JOB * wire.NUM_DROP_REASONS + reason) == 1


def test_transit_switch_routes_a_chain_job_unchanged(switches):
    (s,) = switches(1)
    e = TransitEntry(JOB)
    s.insert_entry(e.table, e.match, e.action, e.params)
    s.insert_entry("MyIngress.ipv4_lpm", ((0x0A00FE02, 32),), "MyIngress.ipv4_forward", (0x0200000000EE, 4))
    next_hop = hop(1, 9)
    frame = bytearray(gradient(Worker(MEMBER, 3), JOB, 0, np.arange(wire.LANES, dtype=np.int32), seq=1))
    pkt = dissect(bytes(frame))
    pkt["IP"].dst = str(next_hop.ip)
    del pkt["IP"].chksum
    s.send(3, bytes(pkt))
    out = s.receive(expect=1)
    assert [p for p, _ in out] == [4]
    got = dissect(out[0][1])
    assert got.dst == "02:00:00:00:00:ee" and got["IP"].ttl == pkt["IP"].ttl - 1
    assert bytes(got[INA]) == bytes(pkt[INA])


def test_new_generation_resets_the_slot_on_every_switch_and_stale_partials_are_dropped(switches):
    fabric, workers_at = two_switches(switches)
    rng = np.random.default_rng(6)

    def round_(seq: int, generation: int) -> np.ndarray:
        total = np.zeros(wire.LANES, np.int64)
        for s, ws in workers_at.items():
            for w in ws:
                v = random_lanes(rng)
                total += v
                fabric.send(s, w.port, gradient(w, JOB, 0, v, seq=seq, generation=generation))
        return total.astype(np.int32)

    # generation 0 leaves a half-done copy (S1's workers never send), then the job moves to generation 1
    for w in workers_at[0]:
        fabric.send(0, w.port, gradient(w, JOB, 0, random_lanes(rng), seq=1))
    assert fabric.run() == {}
    stale = [f for s, _, f in fabric.carried if s == 0]
    for s, t in enumerate(fabric.switches):
        ws = workers_at[s]
        job = job_entries(JOB, [WorkerAddress(w.wid, w.port, w.mac, w.ip, w.udp_port) for w in ws],
                          base_slot=0, num_slots=NUM_SLOTS, generation=1).job
        t.modify_entry(job.table, job.match, job.action, job.params)
    total = round_(1, 1)  # the same seq under the new generation: a fresh copy on both switches
    check_results(fabric.run(), workers_at, {0: total}, {0: 1})
    fabric.switches[1].send(9, stale[0])  # generation 0's partial, late
    assert fabric.switches[1].receive() == []
    reason = int(wire.DropReason.STALE_GENERATION)
    assert fabric.switches[1].read_counter("MyIngress.ina_job_drops", JOB * wire.NUM_DROP_REASONS + reason) == 1


def _partial_of_s0(fabric, workers_at, rng) -> tuple[bytes, np.ndarray]:
    """S0's workers complete slot 0: S0's partial as it leaves towards S1 (not delivered), and the partial sum."""
    total = np.zeros(wire.LANES, np.int64)
    for w in workers_at[0]:
        v = random_lanes(rng)
        total += v
        fabric.send(0, w.port, gradient(w, JOB, 0, v, seq=1))
    out = fabric.switches[0].receive(expect=1)
    assert [p for p, _ in out] == [9]
    return out[0][1], total


def test_partial_is_bound_to_the_link_it_comes_in_on(switches):
    """Ingress binding for chains: S1 binds member S0 to the link on port 9 (bind_link). The same partial on a
    worker's port, or from another UDP port, is SPOOFED and never added; on port 9 it completes the round."""
    fabric, workers_at = two_switches(switches)
    s1 = fabric.switches[1]
    partial, total = _partial_of_s0(fabric, workers_at, np.random.default_rng(7))
    assert dissect(partial)[INA].worker_id == MEMBER
    other = dissect(partial)
    other["UDP"].sport = 40000
    del other["UDP"].chksum
    spoofed = int(wire.DropReason.SPOOFED)
    for port, frame in ((1, partial), (9, bytes(other))):
        s1.send(port, frame)
        assert s1.receive() == []
    assert s1.read_counter("MyIngress.ina_job_drops", JOB * wire.NUM_DROP_REASONS + spoofed) == 2
    assert s1.read_counter("MyIngress.ina_aggregated", JOB) == 0
    fabric.send(1, 9, partial)
    rng = np.random.default_rng(8)
    for w in workers_at[1]:
        v = random_lanes(rng)
        total += v
        fabric.send(1, w.port, gradient(w, JOB, 0, v, seq=1))
    check_results(fabric.run(), workers_at, {0: total.astype(np.int32)}, {0: 1})


def test_final_sum_is_bound_to_the_link_under_the_recipients_id(switches):
    """S0 binds its own member id to the link final sums come in on: the final sum on a worker's port is
    SPOOFED, and S0's workers get the result only from the one on port 9."""
    fabric, workers_at = two_switches(switches)
    s0, s1 = fabric.switches
    partial, total = _partial_of_s0(fabric, workers_at, np.random.default_rng(9))
    s1.send(9, partial)
    assert s1.receive() == []
    rng = np.random.default_rng(10)
    for w in workers_at[1]:
        v = random_lanes(rng)
        total += v
        s1.send(w.port, gradient(w, JOB, 0, v, seq=1))
    out = s1.receive(expect=3)  # S1's two workers and the final sum towards S0
    (final,) = [f for p, f in out if p == 9]
    assert dissect(final)[INA].msg_type == wire.MsgType.RESULT and dissect(final)[INA].worker_id == MEMBER
    s0.send(1, final)
    assert s0.receive() == []
    spoofed = int(wire.DropReason.SPOOFED)
    assert s0.read_counter("MyIngress.ina_job_drops", JOB * wire.NUM_DROP_REASONS + spoofed) == 1
    fabric.send(0, 9, final)
    check_results(fabric.run(), {0: workers_at[0]}, {0: total.astype(np.int32)}, {0: 1})


def test_chain_member_without_an_ingress_port_is_refused():
    job = job_entries(JOB, [], base_slot=0, num_slots=NUM_SLOTS, generation=0)
    with pytest.raises(ValueError, match=r"member ids \[20\]"):
        chain_entries(job, MEMBER + 1, None, [ChainPartition(0, 0, (MEMBER,), True, (hop(0, 9),))], {})
