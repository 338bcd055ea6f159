"""Chains across switches (docs/switch.md, "Chains"): a switch's completed partial goes onward as one contribution,
the final sum comes back, is kept and multicast; loss is recovered end to end. Two and three switches, as a tree
and as Rina's ring of partitions. The test carries frames between the switches' linked ports, so the same cases
run on the model, on ina-switch and on BMv2."""
from __future__ import annotations

import numpy as np
import pytest

from inaproto import wire
from inaproto.job_entries import (
    ChainHop,
    ChainLink,
    ChainPartition,
    TransitEntry,
    WorkerAddress,
    chain_entries,
    job_entries,
)
from inaproto.scapy_layer import INA
from tests.targets import Worker, dissect, gradient

JOB = 5
NUM_SLOTS = 4
MEMBER = 20  # switch s is member MEMBER + s in the job's worker-id space
L9, L10 = ChainLink(9), ChainLink(10)  # a switch's chain packets on port 9 / 10, from INA_UDP_PORT


def _hop(switch: int, port: int) -> ChainHop:
    """Switch ``switch`` as its neighbour sees it, reached out of the neighbour's ``port``."""
    return ChainHop(MEMBER + switch, port, f"02:00:00:00:ee:{switch + 1:02x}", f"10.0.254.{switch + 1}", wire.INA_UDP_PORT)


def _install(target, workers: list[Worker], member: int, next_hop, partitions, sources: dict[int, ChainLink],
             base: int = 0) -> None:
    """``sources``: member id -> the link its chain packets come in on (the ingress binding's bind_link)."""
    job = job_entries(JOB, [WorkerAddress(w.wid, w.port, w.mac, w.ip, w.udp_port) for w in workers],
                      base_slot=base, num_slots=NUM_SLOTS, generation=0)
    job.insert_into(target)
    chain_entries(job, member, next_hop, partitions, sources).insert_into(target)


def _lanes(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(-(2**20), 2**20, size=wire.LANES, dtype=np.int64).astype(np.int32)


class Fabric:
    """Switches and the links between their ports; ``run`` delivers frames until the fabric is quiet."""

    def __init__(self, switches: list, links: dict[tuple[int, int], tuple[int, int]]) -> None:
        self.switches = switches
        self.links = dict(links)
        self.links.update({b: a for a, b in links.items()})
        self.carried: list[tuple[int, int, bytes]] = []  # (switch, port, frame) sent over a link

    def send(self, switch: int, port: int, frame: bytes) -> None:
        self.switches[switch].send(port, frame)

    def run(self, drop=lambda switch, port, frame: False) -> dict[tuple[int, int], list]:
        """Every frame that left towards a worker, as {(switch, port): [dissected]}; ``drop`` loses link frames."""
        delivered: dict[tuple[int, int], list] = {}
        busy = set(range(len(self.switches)))
        while busy:
            outputs = [(s, self.switches[s].receive()) for s in sorted(busy)]
            busy = set()
            for s, out in outputs:
                for port, frame in out:
                    peer = self.links.get((s, port))
                    if peer is None:
                        delivered.setdefault((s, port), []).append(dissect(frame))
                        continue
                    self.carried.append((s, port, frame))
                    if drop(s, port, frame):
                        continue
                    self.switches[peer[0]].send(peer[1], frame)
                    busy.add(peer[0])
        return delivered


def _check(delivered, workers_at: dict[int, list[Worker]], expected: dict[int, np.ndarray], seq_of: dict[int, int],
           flags: int = 0) -> None:
    """Every worker got exactly one result per slot in ``expected``, exact, addressed to it."""
    for s, workers in workers_at.items():
        for w in workers:
            got = delivered.get((s, w.port), [])
            by_slot = {}
            for pkt in got:
                ina = pkt[INA]
                assert ina.msg_type == wire.MsgType.RESULT
                assert ina.worker_id == w.wid and pkt.dst == w.mac and pkt["UDP"].dport == w.udp_port
                assert ina.slot not in by_slot, f"two results for slot {ina.slot} at worker {w.wid}"
                by_slot[ina.slot] = pkt
            assert sorted(by_slot) == sorted(expected), f"worker {w.wid} on switch {s}: slots {sorted(by_slot)}"
            for slot, pkt in by_slot.items():
                assert pkt[INA].seq == seq_of[slot]
                assert int(pkt[INA].flags) == flags
                assert pkt[INA].lanes == [int(v) for v in expected[slot]]
    extra = set(delivered) - {(s, w.port) for s, ws in workers_at.items() for w in ws}
    assert not extra, f"frames to ports without workers: {sorted(extra)}"


def _two_switches(switches):
    """S0 (workers 0, 1) sends its partial out of port 9 to S1 (workers 2, 3), which ends the chain and sends the
    final sum back to S0: a one-level tree, or Rina's ring of two racks for one partition."""
    s0, s1 = switches(2)
    w0 = [Worker(0, 1), Worker(1, 2)]
    w1 = [Worker(2, 1), Worker(3, 2)]
    _install(s0, w0, MEMBER, _hop(1, 9), [ChainPartition(0, 0, (), False)], {MEMBER: L9})
    _install(s1, w1, MEMBER + 1, None, [ChainPartition(0, 0, (MEMBER,), True, (_hop(0, 9),))], {MEMBER: L9})
    return Fabric([s0, s1], {(0, 9): (1, 9)}), {0: w0, 1: w1}


def test_two_switches_partial_goes_on_final_comes_back_rounds_in_both_copies(switches):
    fabric, workers_at = _two_switches(switches)
    rng = np.random.default_rng(1)
    for rnd in range(3):  # three rounds of slot 1: shadow copies 0, 1, 0
        seq, shadow = 1 + rnd, rnd % 2
        total = np.zeros(wire.LANES, np.int64)
        order = [(s, w) for s, ws in workers_at.items() for w in ws]
        if rnd == 1:
            order.reverse()  # the upstream partial after the local workers
        for s, w in order:
            v = _lanes(rng)
            total += v
            fabric.send(s, w.port, gradient(w, JOB, 1, v, seq=seq, shadow=shadow))
        delivered = fabric.run()
        _check(delivered, workers_at, {1: total.astype(np.int32)}, {1: seq})
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
    fabric, workers_at = _two_switches(switches)
    rng = np.random.default_rng(2)
    values = {w.wid: _lanes(rng) for ws in workers_at.values() for w in ws}
    total = sum(v.astype(np.int64) for v in values.values()).astype(np.int32)
    for s, ws in workers_at.items():
        for w in ws:
            fabric.send(s, w.port, gradient(w, JOB, 0, values[w.wid], seq=1))
    delivered = fabric.run(drop=lambda s, port, f: s == 1)  # the final sum towards S0 is lost
    _check(delivered, {1: workers_at[1]}, {0: total}, {0: 1})
    assert all(s != 0 for s, _ in delivered)
    # S0's worker 0 resends: S0 holds only its partial, so it sends that onward again; S1 has the final sum and
    # answers S0 with it; S0 keeps it and multicasts it to its workers.
    w = workers_at[0][0]
    fabric.send(0, w.port, gradient(w, JOB, 0, values[w.wid], seq=1, flags=wire.Flags.RETRANSMIT))
    fabric.carried.clear()
    delivered = fabric.run()
    _check(delivered, {0: workers_at[0]}, {0: total}, {0: 1})
    kinds = sorted((s, dissect(f)[INA].msg_type, int(dissect(f)[INA].flags)) for s, _, f in fabric.carried)
    assert kinds == [(0, wire.MsgType.GRADIENT, int(wire.Flags.RETRANSMIT)), (1, wire.MsgType.RESULT, 0)]
    # now S0 holds the final sum: a further resend is answered by S0 itself
    fabric.carried.clear()
    fabric.send(0, w.port, gradient(w, JOB, 0, values[w.wid], seq=1, flags=wire.Flags.RETRANSMIT))
    delivered = fabric.run()
    assert not fabric.carried
    _check(delivered, {0: [w]}, {0: total}, {0: 1})


def test_lost_partial_is_sent_again_when_a_local_worker_resends(switches):
    fabric, workers_at = _two_switches(switches)
    rng = np.random.default_rng(3)
    values = {w.wid: _lanes(rng) for ws in workers_at.values() for w in ws}
    total = sum(v.astype(np.int64) for v in values.values()).astype(np.int32)
    for s, ws in workers_at.items():
        for w in ws:
            fabric.send(s, w.port, gradient(w, JOB, 2, values[w.wid], seq=7, shadow=1))
    assert fabric.run(drop=lambda s, port, f: s == 0) == {}  # the partial is lost: nobody has a result
    w = workers_at[0][1]
    fabric.send(0, w.port, gradient(w, JOB, 2, values[w.wid], seq=7, shadow=1, flags=wire.Flags.RETRANSMIT))
    delivered = fabric.run()
    _check(delivered, workers_at, {2: total}, {2: 7})
    assert fabric.switches[0].read_counter("MyIngress.ina_partials", JOB) == 2


def test_upstream_overflow_reaches_the_result(switches):
    fabric, workers_at = _two_switches(switches)
    big = np.full(wire.LANES, 2**30 + 2**29, np.int64)
    for w in workers_at[0]:
        fabric.send(0, w.port, gradient(w, JOB, 0, big.astype(np.int32), seq=1))
    for w in workers_at[1]:
        fabric.send(1, w.port, gradient(w, JOB, 0, np.zeros(wire.LANES, np.int32), seq=1))
    delivered = fabric.run()
    wrapped = (big * 2).astype(np.int64).astype(np.uint32).view(np.int32)
    _check(delivered, workers_at, {0: wrapped}, {0: 1}, flags=int(wire.Flags.OVERFLOW))


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
                                        () if m == (p - 1) % 3 else (_hop((m + 1) % 3, 9),)))
        _install(targets[m], workers_at[m], MEMBER + m, _hop((m + 1) % 3, 9), parts,
                 {MEMBER + (m - 1) % 3: L10, MEMBER + m: L10}, base=8 * m)
    fabric = Fabric(targets, {(m, 9): ((m + 1) % 3, 10) for m in range(3)})
    rng = np.random.default_rng(4)
    totals = {p: np.zeros(wire.LANES, np.int64) for p in range(3)}
    for s, ws in workers_at.items():
        for w in ws:
            for p in range(3):
                v = _lanes(rng)
                totals[p] += v
                fabric.send(s, w.port, gradient(w, JOB, p, v, seq=10 + p))
    delivered = fabric.run()
    _check(delivered, workers_at, {p: t.astype(np.int32) for p, t in totals.items()}, {p: 10 + p for p in range(3)})
    # per partition: two partials (reduce-scatter) and two passed-on final sums (all-gather)
    assert sum(t.read_counter("MyIngress.ina_partials", JOB) for t in targets) == 6
    carried = sorted(dissect(f)[INA].msg_type for _, _, f in fabric.carried)
    assert carried == [wire.MsgType.GRADIENT] * 6 + [wire.MsgType.RESULT] * 6


def test_three_switches_tree_root_waits_for_both_children(switches):
    """A two-level tree: ToRs S0 and S1 (two workers each) send their partials to the root S2 (no workers of
    its own, ports 9 and 10), whose final sum goes back down to both and from each to its workers."""
    s0, s1, root = switches(3)
    w0, w1 = [Worker(0, 1), Worker(1, 2)], [Worker(2, 1), Worker(3, 2)]
    _install(s0, w0, MEMBER, _hop(2, 9), [ChainPartition(0, 0, (), False)], {MEMBER: L9})
    _install(s1, w1, MEMBER + 1, _hop(2, 9), [ChainPartition(0, 0, (), False)], {MEMBER + 1: L9})
    _install(root, [], MEMBER + 2, None, [ChainPartition(0, 0, (MEMBER, MEMBER + 1), True, (_hop(0, 9), _hop(1, 10)))],
             {MEMBER: L9, MEMBER + 1: L10})
    fabric = Fabric([s0, s1, root], {(0, 9): (2, 9), (1, 9): (2, 10)})
    rng = np.random.default_rng(5)
    total = np.zeros(wire.LANES, np.int64)
    for s, ws in ((0, w0), (1, w1)):
        for w in ws:
            v = _lanes(rng)
            total += v
            fabric.send(s, w.port, gradient(w, JOB, 3, v, seq=2))
    delivered = fabric.run()
    _check(delivered, {0: w0, 1: w1}, {3: total.astype(np.int32)}, {3: 2})
    assert root.read_counter("MyIngress.ina_aggregated", JOB) == 2


def test_result_for_another_member_is_dropped_and_counted(switches):
    fabric, _workers_at = _two_switches(switches)
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
    hop = _hop(1, 9)
    frame = bytearray(gradient(Worker(MEMBER, 3), JOB, 0, np.arange(wire.LANES, dtype=np.int32), seq=1))
    pkt = dissect(bytes(frame))
    pkt["IP"].dst = str(hop.ip)
    del pkt["IP"].chksum
    s.send(3, bytes(pkt))
    out = s.receive(expect=1)
    assert [p for p, _ in out] == [4]
    got = dissect(out[0][1])
    assert got.dst == "02:00:00:00:00:ee" and got["IP"].ttl == pkt["IP"].ttl - 1
    assert bytes(got[INA]) == bytes(pkt[INA])


def test_new_generation_resets_the_slot_on_every_switch_and_stale_partials_are_dropped(switches):
    fabric, workers_at = _two_switches(switches)
    rng = np.random.default_rng(6)

    def round_(seq: int, generation: int) -> np.ndarray:
        total = np.zeros(wire.LANES, np.int64)
        for s, ws in workers_at.items():
            for w in ws:
                v = _lanes(rng)
                total += v
                fabric.send(s, w.port, gradient(w, JOB, 0, v, seq=seq, generation=generation))
        return total.astype(np.int32)

    # generation 0 leaves a half-done copy (S1's workers never send), then the job moves to generation 1
    for w in workers_at[0]:
        fabric.send(0, w.port, gradient(w, JOB, 0, _lanes(rng), seq=1))
    assert fabric.run() == {}
    stale = [f for s, _, f in fabric.carried if s == 0]
    for s, t in enumerate(fabric.switches):
        ws = workers_at[s]
        job = job_entries(JOB, [WorkerAddress(w.wid, w.port, w.mac, w.ip, w.udp_port) for w in ws],
                          base_slot=0, num_slots=NUM_SLOTS, generation=1).job
        t.modify_entry(job.table, job.match, job.action, job.params)
    total = round_(1, 1)  # the same seq under the new generation: a fresh copy on both switches
    _check(fabric.run(), workers_at, {0: total}, {0: 1})
    fabric.switches[1].send(9, stale[0])  # generation 0's partial, late
    assert fabric.switches[1].receive() == []
    reason = int(wire.DropReason.STALE_GENERATION)
    assert fabric.switches[1].read_counter("MyIngress.ina_job_drops", JOB * wire.NUM_DROP_REASONS + reason) == 1


def _partial_of_s0(fabric, workers_at, rng) -> tuple[bytes, np.ndarray]:
    """S0's workers complete slot 0: S0's partial as it leaves towards S1 (not delivered), and the partial sum."""
    total = np.zeros(wire.LANES, np.int64)
    for w in workers_at[0]:
        v = _lanes(rng)
        total += v
        fabric.send(0, w.port, gradient(w, JOB, 0, v, seq=1))
    out = fabric.switches[0].receive(expect=1)
    assert [p for p, _ in out] == [9]
    return out[0][1], total


def test_partial_is_bound_to_the_link_it_comes_in_on(switches):
    """Ingress binding for chains: S1 binds member S0 to the link on port 9 (bind_link). The same partial on a
    worker's port, or from another UDP port, is SPOOFED and never added; on port 9 it completes the round."""
    fabric, workers_at = _two_switches(switches)
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
        v = _lanes(rng)
        total += v
        fabric.send(1, w.port, gradient(w, JOB, 0, v, seq=1))
    _check(fabric.run(), workers_at, {0: total.astype(np.int32)}, {0: 1})


def test_final_sum_is_bound_to_the_link_under_the_recipients_id(switches):
    """S0 binds its own member id to the link final sums come in on: the final sum on a worker's port is
    SPOOFED, and S0's workers get the result only from the one on port 9."""
    fabric, workers_at = _two_switches(switches)
    s0, s1 = fabric.switches
    partial, total = _partial_of_s0(fabric, workers_at, np.random.default_rng(9))
    s1.send(9, partial)
    assert s1.receive() == []
    rng = np.random.default_rng(10)
    for w in workers_at[1]:
        v = _lanes(rng)
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
    _check(fabric.run(), {0: workers_at[0]}, {0: total.astype(np.int32)}, {0: 1})


def test_chain_member_without_an_ingress_port_is_refused():
    job = job_entries(JOB, [], base_slot=0, num_slots=NUM_SLOTS, generation=0)
    with pytest.raises(ValueError, match=r"member ids \[20\]"):
        chain_entries(job, MEMBER + 1, None, [ChainPartition(0, 0, (MEMBER,), True, (_hop(0, 9),))], {})
