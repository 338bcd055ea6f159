"""Packet-level behaviour of the aggregation pipeline: scapy frames in, exact bytes and values out."""
from __future__ import annotations

import random

import numpy as np
import pytest

from inaproto import wire
from inaproto.scapy_layer import INA
from tests.support.entries import install_job
from tests.support.frames import SWITCH_IP, SWITCH_MAC, dissect, gradient, make_workers, random_lanes


def _results(out):
    """{worker port: dissected result} for a list of emitted frames, each port at most once."""
    by_port = {}
    for port, frame in out:
        assert port not in by_port, f"two results on port {port}"
        by_port[port] = dissect(frame)
    return by_port


def _check_result(pkt, worker, job_id, seq, expected, slot, shadow, flags=0):
    ina = pkt[INA]
    assert ina.msg_type == wire.MsgType.RESULT
    assert (ina.job_id, ina.seq, ina.slot, ina.shadow, ina.worker_id) == (job_id, seq, slot, shadow, worker.wid)
    assert int(ina.flags) == flags
    assert ina.lanes == [int(v) for v in expected]
    assert pkt.dst == worker.mac and pkt.src == SWITCH_MAC
    assert pkt["IP"].dst == worker.ip and pkt["IP"].src == SWITCH_IP
    assert pkt["UDP"].dport == worker.udp_port and pkt["UDP"].sport == wire.INA_UDP_PORT
    assert pkt["UDP"].chksum == 0
    assert pkt["IP"].len == wire.INA_IPV4_LEN and pkt["UDP"].len == wire.INA_UDP_LEN


@pytest.mark.parametrize("k", range(2, 9))
def test_k_workers_receive_exact_sum(target, k):
    rng = np.random.default_rng(k)
    workers = make_workers(k)
    install_job(target, job_id=7, workers=workers, base=100, num_slots=8)
    data = [random_lanes(rng) for _ in workers]
    for i, w in enumerate(workers):
        target.send(w.port, gradient(w, 7, slot=3, lanes=data[i], seq=1234, shadow=1))
        out = target.receive(expect=k if i == k - 1 else 0, timeout=2.0 if i == k - 1 else 0.05)
        if i < k - 1:
            assert out == [], "no output before the last contribution"
    results = _results(out)
    assert set(results) == {w.port for w in workers}
    expected = np.sum(np.stack(data).astype(np.int64), axis=0)
    for w in workers:
        _check_result(results[w.port], w, 7, 1234, expected, slot=3, shadow=1)
    assert target.read_counter("MyIngress.ina_aggregated", 7) == k
    assert target.read_counter("MyEgress.ina_results", 7) == k


def test_result_ip_checksum_is_valid(target):
    workers = make_workers(2)
    install_job(target, 1, workers, base=0, num_slots=4)
    target.send(1, gradient(workers[0], 1, 0, [1] * wire.LANES))
    target.send(2, gradient(workers[1], 1, 0, [2] * wire.LANES))
    for _, frame in target.receive(expect=2):
        pkt = dissect(frame)
        stated = pkt["IP"].chksum
        del pkt["IP"].chksum
        assert dissect(bytes(pkt))["IP"].chksum == stated


def test_two_jobs_never_mix(target):
    rng = np.random.default_rng(1)
    a, b = make_workers(3, first_port=1), make_workers(3, first_port=4)
    install_job(target, 1, a, base=0, num_slots=16)
    install_job(target, 2, b, base=16, num_slots=16)
    da = [random_lanes(rng) for _ in a]
    db = [random_lanes(rng) for _ in b]
    # Interleave the two jobs on the same slot index within their ranges.
    for i in range(3):
        target.send(a[i].port, gradient(a[i], 1, 5, da[i], seq=10))
        target.send(b[i].port, gradient(b[i], 2, 5, db[i], seq=20))
    res = _results(target.receive(expect=6))
    for w in a:
        _check_result(res[w.port], w, 1, 10, np.sum(np.stack(da).astype(np.int64), 0), slot=5, shadow=0)
    for w in b:
        _check_result(res[w.port], w, 2, 20, np.sum(np.stack(db).astype(np.int64), 0), slot=5, shadow=0)


def test_retransmission_before_completion_not_double_counted(target):
    workers = make_workers(3)
    install_job(target, 4, workers, base=0, num_slots=2)
    target.send(1, gradient(workers[0], 4, 0, [5] * wire.LANES))
    target.send(1, gradient(workers[0], 4, 0, [5] * wire.LANES, flags=wire.Flags.RETRANSMIT))
    target.send(2, gradient(workers[1], 4, 0, [7] * wire.LANES))
    assert target.receive(expect=0, timeout=0.05) == []
    target.send(3, gradient(workers[2], 4, 0, [11] * wire.LANES))
    res = _results(target.receive(expect=3))
    for w in workers:
        _check_result(res[w.port], w, 4, 0, [23] * wire.LANES, slot=0, shadow=0)
    assert target.read_counter("MyIngress.ina_duplicates", 4) == 1
    assert target.read_counter("MyIngress.ina_aggregated", 4) == 3


def test_retransmission_after_completion_answers_sender_only(target):
    workers = make_workers(3)
    install_job(target, 4, workers, base=0, num_slots=2)
    for i, w in enumerate(workers):
        target.send(w.port, gradient(w, 4, 1, [i + 1] * wire.LANES, seq=77, shadow=1))
    assert len(target.receive(expect=3)) == 3
    # Worker 1's result was lost: it resends and gets the result alone.
    target.send(2, gradient(workers[1], 4, 1, [2] * wire.LANES, seq=77, shadow=1, flags=wire.Flags.RETRANSMIT))
    out = target.receive(expect=1)
    assert [p for p, _ in out] == [2]
    _check_result(dissect(out[0][1]), workers[1], 4, 77, [6] * wire.LANES, slot=1, shadow=1)
    assert target.read_counter("MyEgress.ina_results", 4) == 4


def test_shadow_sets_over_many_rounds_with_random_loss(target):
    """Workers run SwitchML's protocol over a few slots; the network loses packets both ways."""
    k, slots, chunks = 4, 3, 40
    rng = np.random.default_rng(5)
    lossy = random.Random(9)
    workers = make_workers(k)
    install_job(target, 9, workers, base=500, num_slots=slots)
    data = rng.integers(-1000, 1000, size=(k, chunks, wire.LANES)).astype(np.int32)
    expected = data.astype(np.int64).sum(axis=0)
    got = [{} for _ in workers]  # per worker: chunk -> lanes
    in_flight = [{} for _ in workers]  # slot -> chunk
    port_to_worker = {w.port: i for i, w in enumerate(workers)}

    def send(i, chunk, retransmit=False):
        if lossy.random() < 0.2:
            return  # lost on the way to the switch
        w = workers[i]
        target.send(w.port, gradient(w, 9, chunk % slots, data[i, chunk], seq=chunk, shadow=(chunk // slots) % 2,
                                     flags=wire.Flags.RETRANSMIT if retransmit else 0))

    for i in range(k):
        for c in range(slots):
            in_flight[i][c] = c
            send(i, c)
    for _ in range(2000):
        if all(len(g) == chunks for g in got):
            break
        out = target.receive(expect=None, timeout=0.2)
        for port, frame in out:
            if lossy.random() < 0.2:
                continue  # result lost on the way back
            i = port_to_worker[port]
            ina = dissect(frame)[INA]
            chunk = ina.seq
            if in_flight[i].get(ina.slot) != chunk:
                continue  # a late duplicate
            got[i][chunk] = list(ina.lanes)
            c = chunk + slots  # slot s carries chunks s, s+S, s+2S, ... alternating shadow copies
            if c < chunks:
                in_flight[i][ina.slot] = c
                send(i, c)
            else:
                del in_flight[i][ina.slot]
        if not out:  # timeout: every worker resends what it still waits for
            for i in range(k):
                for c in in_flight[i].values():
                    send(i, c, retransmit=True)
    for i in range(k):
        assert sorted(got[i]) == list(range(chunks))
        for c in range(chunks):
            assert got[i][c] == [int(v) for v in expected[c]], (i, c)


def test_overflow_is_flagged(target):
    workers = make_workers(2)
    install_job(target, 3, workers, base=0, num_slots=1)
    big = [2**31 - 1] + [0] * (wire.LANES - 1)
    target.send(1, gradient(workers[0], 3, 0, big))
    target.send(2, gradient(workers[1], 3, 0, [1] * wire.LANES))
    res = _results(target.receive(expect=2))
    for w in workers:
        ina = res[w.port][INA]
        assert int(ina.flags) == wire.Flags.OVERFLOW
        assert ina.lanes[0] == -(2**31)  # int32 wrap-around, as bit<32> addition does
    # The next round in the same slot copy starts clean.
    target.send(1, gradient(workers[0], 3, 0, [1] * wire.LANES, shadow=1, seq=1))
    target.send(2, gradient(workers[1], 3, 0, [1] * wire.LANES, shadow=1, seq=1))
    for _, frame in target.receive(expect=2):
        assert int(dissect(frame)[INA].flags) == 0


def test_negative_overflow_is_flagged(target):
    workers = make_workers(3)
    install_job(target, 3, workers, base=0, num_slots=1)
    for w in workers:
        target.send(w.port, gradient(w, 3, 0, [-(2**30)] * wire.LANES))
    for _, frame in target.receive(expect=3):
        assert int(dissect(frame)[INA].flags) == wire.Flags.OVERFLOW


def test_slot_reused_by_new_owner_is_reset_by_data_plane(target):
    """Job 1 leaves a slot half-filled; job 2 gets the same range and must not see job 1's partial sum."""
    a, b = make_workers(2), make_workers(2, first_port=3)
    install_job(target, 1, a, base=10, num_slots=1)
    target.send(1, gradient(a[0], 1, 0, [1000] * wire.LANES))  # never completed
    install_job(target, 2, b, base=10, num_slots=1)
    target.send(3, gradient(b[0], 2, 0, [1] * wire.LANES))
    target.send(4, gradient(b[1], 2, 0, [2] * wire.LANES))
    res = _results(target.receive(expect=2))
    assert all(r[INA].lanes == [3] * wire.LANES for r in res.values())


def test_new_generation_resets_slot_and_drops_stale_packets(target):
    workers = make_workers(2)
    install_job(target, 5, workers, base=0, num_slots=2, generation=1)
    target.send(1, gradient(workers[0], 5, 0, [100] * wire.LANES, generation=1))  # half done under gen 1
    # A switch takes frames and table writes on separate paths: wait until it has processed the frame (it
    # emits nothing) before the generation changes, or the frame may meet generation 2 and count as stale.
    assert target.receive(expect=0, timeout=0.05) == []
    target.modify_entry("MyIngress.ina_job", (5,), "MyIngress.set_job", (0, 2, 0b11, 2, 6, 2, 0))
    target.send(2, gradient(workers[1], 5, 0, [100] * wire.LANES, generation=1))  # stale now
    assert target.receive(expect=0, timeout=0.05) == []
    assert target.read_counter("MyIngress.ina_drops", wire.DropReason.STALE_GENERATION) == 1
    assert target.read_counter("MyIngress.ina_job_drops", 5 * wire.NUM_DROP_REASONS + wire.DropReason.STALE_GENERATION) == 1
    target.send(1, gradient(workers[0], 5, 0, [1] * wire.LANES, generation=2))
    target.send(2, gradient(workers[1], 5, 0, [2] * wire.LANES, generation=2))
    res = _results(target.receive(expect=2))
    assert all(r[INA].lanes == [3] * wire.LANES and r[INA].generation == 2 for r in res.values())


def test_broadcast_goes_to_every_worker_unchanged(target):
    workers = make_workers(4)
    install_job(target, 8, workers, base=0, num_slots=1)
    payload = list(range(-16, 16))
    target.send(1, gradient(workers[0], 8, 0, payload, seq=42, msg_type=wire.MsgType.BROADCAST))
    res = _results(target.receive(expect=4))
    assert set(res) == {w.port for w in workers}
    for w in workers:
        ina = res[w.port][INA]
        assert ina.msg_type == wire.MsgType.BROADCAST and ina.lanes == payload and ina.seq == 42 and ina.worker_id == w.wid
        assert res[w.port]["IP"].dst == w.ip and res[w.port]["UDP"].dport == w.udp_port
    assert target.read_counter("MyIngress.ina_aggregated", 8) == 0


def test_late_retransmission_never_enters_a_later_round(target):
    """A retransmission the network delayed past its round (reordering) must not be added to the slot copy's
    next round, nor to a round in progress: the copy remembers which chunk it holds."""
    workers = make_workers(2)
    install_job(target, 6, workers, base=0, num_slots=1)
    rounds = [(0, 0), (1, 1), (2, 0), (3, 1)]  # (chunk, shadow) through the single slot
    stale = gradient(workers[0], 6, 0, [1000] * wire.LANES, seq=0, shadow=0, flags=wire.Flags.RETRANSMIT)
    for chunk, shadow in rounds[:2]:
        for w in workers:
            target.send(w.port, gradient(w, 6, 0, [chunk + 1] * wire.LANES, seq=chunk, shadow=shadow))
        assert len(target.receive(expect=2)) == 2
    # Chunk 0's retransmission arrives now: worker 0 has moved on (its bit in copy 0 is cleared).
    target.send(1, stale)
    assert target.receive(expect=0, timeout=0.05) == []
    # Chunk 2 starts in copy 0; the stale packet arrives again mid-round.
    target.send(2, gradient(workers[1], 6, 0, [3] * wire.LANES, seq=2, shadow=0))
    target.send(1, stale)
    assert target.receive(expect=0, timeout=0.05) == []
    target.send(1, gradient(workers[0], 6, 0, [3] * wire.LANES, seq=2, shadow=0))
    res = _results(target.receive(expect=2))
    assert all(r[INA].lanes == [6] * wire.LANES and r[INA].seq == 2 for r in res.values())
    # And once chunk 2 is complete, the two-rounds-old packet neither restarts the copy nor gets an answer.
    target.send(1, stale)
    assert target.receive(expect=0, timeout=0.05) == []
    target.send(2, gradient(workers[1], 6, 0, [3] * wire.LANES, seq=2, shadow=0, flags=wire.Flags.RETRANSMIT))
    out = target.receive(expect=1)
    assert [dissect(f)[INA].lanes for _, f in out] == [[6] * wire.LANES]
    assert target.read_counter("MyIngress.ina_duplicates", 6) == 4
