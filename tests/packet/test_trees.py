"""A two-level aggregation tree (docs/switch.md, "Chains"): ToRs S0 and S1 send their partials to the
root S2, whose final sum comes back down; loss on either level is recovered from the nearest copy holding the
final sum, or by the partial sent up again. Frames are carried between linked ports by the test, so the cases
run on the model, ina-switch and BMv2 (tests/support/fabric.py)."""
from __future__ import annotations

import numpy as np

from inaproto import wire
from inaproto.scapy_layer import INA
from tests.support.fabric import CHAIN_JOB as JOB
from tests.support.fabric import L9, L10, MEMBER, Fabric, check_results, hop, install_member
from tests.support.frames import Worker, dissect, gradient, random_lanes


def _tree(switches):
    s0, s1, root = switches(3)
    w0, w1 = [Worker(0, 1), Worker(1, 2)], [Worker(2, 1), Worker(3, 2)]
    from inaproto.job_entries import ChainPartition

    install_member(s0, w0, MEMBER, hop(2, 9), [ChainPartition(0, 0, (), False)], {MEMBER: L9})
    install_member(s1, w1, MEMBER + 1, hop(2, 9), [ChainPartition(0, 0, (), False)], {MEMBER + 1: L9})
    install_member(root, [], MEMBER + 2, None,
             [ChainPartition(0, 0, (MEMBER, MEMBER + 1), True, (hop(0, 9), hop(1, 10)))],
             {MEMBER: L9, MEMBER + 1: L10})
    return Fabric([s0, s1, root], {(0, 9): (2, 9), (1, 9): (2, 10)}), {0: w0, 1: w1}


def _kinds(fabric) -> list[tuple[int, int, int]]:
    """(switch, message type, worker id) of every frame carried over a link, in order."""
    return [(s, dissect(f)[INA].msg_type, dissect(f)[INA].worker_id) for s, _, f in fabric.carried]


def test_rounds_in_both_copies_one_partial_up_and_one_final_down_per_tor(switches):
    fabric, workers_at = _tree(switches)
    rng = np.random.default_rng(11)
    for rnd in range(3):
        seq, shadow = 1 + rnd, rnd % 2
        total = np.zeros(wire.LANES, np.int64)
        for s, ws in workers_at.items():
            for w in ws:
                v = random_lanes(rng)
                total += v
                fabric.send(s, w.port, gradient(w, JOB, 2, v, seq=seq, shadow=shadow))
        check_results(fabric.run(), workers_at, {2: total.astype(np.int32)}, {2: seq})
        assert sorted(_kinds(fabric)) == [(0, wire.MsgType.GRADIENT, MEMBER), (1, wire.MsgType.GRADIENT, MEMBER + 1),
                                          (2, wire.MsgType.RESULT, MEMBER), (2, wire.MsgType.RESULT, MEMBER + 1)]
        fabric.carried.clear()
    root = fabric.switches[2]
    assert root.read_counter("MyIngress.ina_aggregated", JOB) == 6
    assert root.read_counter("MyEgress.ina_results", JOB) == 6


def test_final_lost_towards_one_tor_is_answered_by_the_root_then_by_the_tor(switches):
    fabric, workers_at = _tree(switches)
    rng = np.random.default_rng(12)
    values = {w.wid: random_lanes(rng) for ws in workers_at.values() for w in ws}
    total = sum(v.astype(np.int64) for v in values.values()).astype(np.int32)
    for s, ws in workers_at.items():
        for w in ws:
            fabric.send(s, w.port, gradient(w, JOB, 0, values[w.wid], seq=5))
    delivered = fabric.run(drop=lambda s, port, f: s == 2 and port == 10)  # the root's final to S1 is lost
    check_results(delivered, {0: workers_at[0]}, {0: total}, {0: 5})
    # worker 3 (under S1) resends: S1 holds its partial only and sends it up again; the root answers S1 alone
    w = workers_at[1][1]
    fabric.carried.clear()
    fabric.send(1, w.port, gradient(w, JOB, 0, values[w.wid], seq=5, flags=wire.Flags.RETRANSMIT))
    check_results(fabric.run(), {1: workers_at[1]}, {0: total}, {0: 5})
    assert _kinds(fabric) == [(1, wire.MsgType.GRADIENT, MEMBER + 1), (2, wire.MsgType.RESULT, MEMBER + 1)]
    # S1 keeps the final sum: the next resend is answered there, nothing crosses the uplink
    fabric.carried.clear()
    fabric.send(1, w.port, gradient(w, JOB, 0, values[w.wid], seq=5, flags=wire.Flags.RETRANSMIT))
    check_results(fabric.run(), {1: [w]}, {0: total}, {0: 5})
    assert not fabric.carried


def test_partial_lost_on_the_way_up_is_sent_again_and_the_root_completes(switches):
    fabric, workers_at = _tree(switches)
    rng = np.random.default_rng(13)
    values = {w.wid: random_lanes(rng) for ws in workers_at.values() for w in ws}
    total = sum(v.astype(np.int64) for v in values.values()).astype(np.int32)
    for s, ws in workers_at.items():
        for w in ws:
            fabric.send(s, w.port, gradient(w, JOB, 1, values[w.wid], seq=9, shadow=1))
    assert fabric.run(drop=lambda s, port, f: s == 0) == {}  # S0's partial is lost: the root waits
    # a worker of the other rack resends: S1's partial again, a duplicate at the root (no answer yet)
    w = workers_at[1][0]
    fabric.carried.clear()
    fabric.send(1, w.port, gradient(w, JOB, 1, values[w.wid], seq=9, shadow=1, flags=wire.Flags.RETRANSMIT))
    assert fabric.run() == {}
    assert _kinds(fabric) == [(1, wire.MsgType.GRADIENT, MEMBER + 1)]
    # a worker of S0 resends: the partial goes up again and the root's final reaches both racks
    w = workers_at[0][1]
    fabric.send(0, w.port, gradient(w, JOB, 1, values[w.wid], seq=9, shadow=1, flags=wire.Flags.RETRANSMIT))
    check_results(fabric.run(), workers_at, {1: total}, {1: 9})
    assert fabric.switches[0].read_counter("MyIngress.ina_partials", JOB) == 2
    assert fabric.switches[2].read_counter("MyIngress.ina_duplicates", JOB) == 1
