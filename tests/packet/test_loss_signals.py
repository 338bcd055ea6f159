"""Loss signals (docs/protocol.md, "Loss signals"): a worker's transmission counter on its counted gradients
(TX_COUNTED), the gap report the switch sends when frames of that worker did not arrive (GAP), and the previous
completion named in every counted completion's result (PREV_DONE). Exact bytes out, on every target; the
registers where the target shows them (the model)."""
from __future__ import annotations

import numpy as np
from scapy.all import IP, UDP, Ether, Raw, raw

from inaproto import wire
from inaproto.job_entries import WorkerAddress, job_entries
from inaproto.scapy_layer import INA
from tests.support.entries import install_job
from tests.support.fabric import CHAIN_JOB, two_switches
from tests.support.frames import SWITCH_IP, SWITCH_MAC, Worker, dissect, gradient, make_workers
from tests.targets import assert_same_registers, register_state

JOB, GEN, BASE, SLOTS = 6, 2, 40, 8
COUNTED = int(wire.Flags.TX_COUNTED)
PREV_DONE = int(wire.Flags.PREV_DONE)
GAP = int(wire.Flags.GAP)


def held(value: int, generation: int = GEN) -> int:
    """A value of ina_tx_next / ina_last_done as the switch keeps it: generation << 8 | 0x80 | 7 bits."""
    return generation << 8 | 0x80 | value


def _lanes(worker: Worker, seq: int) -> list[int]:
    return [(worker.wid + 1) * 1000 + seq * 3 + lane for lane in range(wire.LANES)]


def _sum(workers: list[Worker], seq: int) -> list[int]:
    return [sum(col) for col in zip(*(_lanes(w, seq) for w in workers))]


def counted(w: Worker, slot: int, seq: int, tx: int, *, shadow: int = 0, flags: int = 0, job: int = JOB,
            generation: int = GEN) -> bytes:
    """A counted gradient: ``tx`` is the worker's transmission counter mod 128."""
    return gradient(w, job, slot, _lanes(w, seq), seq=seq, shadow=shadow, generation=generation,
                    flags=COUNTED | flags, reserved=tx)


def _result(w: Worker, slot: int, seq: int, lanes: list[int], *, flags: int, reserved: int, shadow: int = 0,
            gap: tuple[int, int] | None = None, generation: int = GEN) -> bytes:
    """The exact result frame ``w`` gets (a replica of a multicast, or the answer to its resend); ``gap``: (frames
    lost, revealing counter) that its own frame revealed, carried with GAP in the slot field."""
    if gap is not None:
        flags, slot = flags | GAP, gap[0] << 7 | gap[1]
    return raw(Ether(src=SWITCH_MAC, dst=w.mac) / IP(src=SWITCH_IP, dst=w.ip)
               / UDP(sport=wire.INA_UDP_PORT, dport=w.udp_port, chksum=0)
               / INA(msg_type=wire.MsgType.RESULT, flags=flags, job_id=JOB, generation=generation, slot=slot, seq=seq,
                     worker_id=w.wid, reserved=reserved, shadow=shadow, lanes=lanes))


def _gap_report(w: Worker, seq: int, tx: int, lost: int, *, shadow: int = 0) -> bytes:
    """The exact gap report: a header-only STATUS with GAP, slot = frames lost, reserved = the revealing counter
    (seq, shadow and the rest are the revealing frame's)."""
    h = wire.InaHeader(wire.MsgType.STATUS, wire.Flags.GAP, JOB, GEN, lost, seq, w.wid, shadow, tx)
    return raw(Ether(src=SWITCH_MAC, dst=w.mac) / IP(src=SWITCH_IP, dst=w.ip)
               / UDP(sport=wire.INA_UDP_PORT, dport=w.udp_port, chksum=0) / Raw(wire.pack_header(h)))


def _setup(target, k: int = 2) -> list[Worker]:
    workers = make_workers(k)
    install_job(target, JOB, workers, base=BASE, num_slots=SLOTS, generation=GEN)
    return workers


def _quiet(target) -> None:
    """Nothing came out for the frames sent so far. A condition, not a wait for silence: the model's outputs are
    there when ``send`` returns, and a switch process's ``receive`` returns once a barrier frame sent behind them
    on every port used came back (tests/integration/switch_process.py), i.e. after everything the switch emitted for
    them; ``expect=0`` waits for nothing more."""
    assert target.receive(expect=0) == []


def _one(target, port: int) -> bytes:
    out = target.receive(expect=1)
    assert [p for p, _ in out] == [port], out
    return out[0][1]


def _multicast(target, workers: list[Worker], slot: int, seq: int, *, flags: int, reserved: int, shadow: int = 0,
               gap: tuple[Worker, int, int] | None = None, generation: int = GEN) -> None:
    """Exactly one result per worker, each byte for byte; ``gap``: (the completing frame's sender, frames lost, its
    counter): that worker's copy alone carries the gap."""
    out = target.receive(expect=len(workers))
    assert sorted(p for p, _ in out) == [w.port for w in workers]
    lanes = _sum(workers, seq)
    for w in workers:
        got = next(f for p, f in out if p == w.port)
        mine = gap[1:] if gap is not None and gap[0] is w else None
        want = _result(w, slot, seq, lanes, flags=flags, reserved=reserved, shadow=shadow, gap=mine,
                       generation=generation)
        assert got == want, dissect(got).show(dump=True)


def _registers(target):
    """(ina_tx_next, ina_last_done) where the target shows its registers, else None."""
    pipeline = getattr(target, "pipeline", None)
    return None if pipeline is None else (pipeline.ina_tx_next, pipeline.ina_last_done)


def test_counted_stream_without_loss_names_the_previous_completion(target):
    w0, w1 = workers = _setup(target)
    for k, seq in enumerate((200, 201, 202, 330)):  # low 7 bits 72, 73, 74, 74
        slot = k % SLOTS
        target.send(w0.port, counted(w0, slot, seq, tx=k))
        _quiet(target)  # no report: nothing was lost
        target.send(w1.port, counted(w1, slot, seq, tx=k))
        if k == 0:  # the job's first completion: no previous one
            _multicast(target, workers, slot, seq, flags=0, reserved=0)
        else:
            _multicast(target, workers, slot, seq, flags=PREV_DONE, reserved=(200, 201, 202)[k - 1] & 0x7F)
    regs = _registers(target)
    if regs is not None:
        tx_next, last_done = regs
        assert (tx_next[JOB * 32], tx_next[JOB * 32 + 1], last_done[JOB]) == (held(4), held(4), held(330 & 0x7F))
        assert sum(tx_next) == held(4) * 2 and sum(last_done) == last_done[JOB]
    assert target.read_counter("MyEgress.ina_results", JOB) == 8


def test_dropped_frame_makes_the_next_dropped_frame_a_gap_report(target):
    w0, w1 = workers = _setup(target)
    target.send(w0.port, counted(w0, 0, 10, tx=0))
    _quiet(target)
    # tx 1 (slot 1, chunk 11) is lost; tx 2 joins slot 2 without completing it: its fate is a drop, so it
    # becomes the report "1 frame before tx 2 did not arrive", with the revealing frame's header fields
    target.send(w0.port, counted(w0, 2, 12, tx=2, shadow=1))
    assert _one(target, w0.port) == _gap_report(w0, 12, tx=2, lost=1, shadow=1)
    regs = _registers(target)
    if regs is not None:
        assert regs[0][JOB * 32] == held(3)
    # the reported frame was still aggregated: worker 1 completes slot 2 with it
    target.send(w1.port, counted(w1, 2, 12, tx=0, shadow=1))
    _multicast(target, workers, 2, 12, flags=0, reserved=0, shadow=1)
    # the counter continues from the report: tx 3 is no gap; then tx 4 and 5 are lost and tx 6 is a duplicate
    # of chunk 10 (dropped: slot 0 waits for worker 1), reported as 2 frames lost
    target.send(w0.port, counted(w0, 3, 13, tx=3))
    _quiet(target)
    target.send(w0.port, counted(w0, 0, 10, tx=6, flags=int(wire.Flags.RETRANSMIT)))
    assert _one(target, w0.port) == _gap_report(w0, 10, tx=6, lost=2)
    target.send(w0.port, counted(w0, 4, 14, tx=7))
    _quiet(target)
    assert target.read_counter("MyIngress.ina_duplicates", JOB) == 1
    assert target.read_counter("MyIngress.ina_aggregated", JOB) == 5
    assert target.read_counter("MyEgress.ina_results", JOB) == 2


def test_gap_revealed_by_a_completion_or_an_answer_goes_to_its_sender_in_the_result(target):
    """A delivered frame that reveals a gap carries it to its sender: GAP in the sender's copy of the completion
    (the other workers' copies are as without loss), or in the answer to a resend; slot = lost << 7 | counter. The
    counter expected next follows it, so the next frame in sequence is no gap."""
    w0, w1 = workers = _setup(target)
    target.send(w1.port, counted(w1, 0, 20, tx=0))
    target.send(w1.port, counted(w1, 1, 21, tx=1))
    _quiet(target)
    target.send(w0.port, counted(w0, 0, 20, tx=0))
    _multicast(target, workers, 0, 20, flags=0, reserved=0)
    # tx 1 is lost; tx 2 completes slot 1: worker 0's copy says "1 frame before tx 2 did not arrive"
    target.send(w0.port, counted(w0, 1, 21, tx=2))
    _multicast(target, workers, 1, 21, flags=PREV_DONE, reserved=20, gap=(w0, 1, 2))
    regs = _registers(target)
    if regs is not None:
        assert regs[0][JOB * 32] == held(3)
    # tx 3 and 4 are lost; tx 5 resends chunk 20, answered from the complete copy (reserved 0, no PREV_DONE)
    # with the gap of 2 frames
    target.send(w0.port, counted(w0, 0, 20, tx=5, flags=int(wire.Flags.RETRANSMIT)))
    assert _one(target, w0.port) == _result(w0, 0, 20, _sum(workers, 20), flags=0, reserved=0, gap=(2, 5))
    # tx 6 is in sequence: dropped (slot 2 waits for worker 1), no report
    target.send(w0.port, counted(w0, 2, 22, tx=6))
    _quiet(target)
    if regs is not None:
        assert regs[0][JOB * 32] == held(7) and regs[1][JOB] == held(21)
    # worker 1 completes slot 2 in sequence: no gap in anybody's copy
    target.send(w1.port, counted(w1, 2, 22, tx=2))
    _multicast(target, workers, 2, 22, flags=PREV_DONE, reserved=21)


def test_the_last_contributor_gets_every_gap(target):
    """A worker whose every frame completes a slot (a straggler: its peers are always ahead) learns each of its
    losses from its copy of the result, however many frames apart: the counter expected next never goes stale
    (before, a gap revealed by a completion was never reported and left the counter behind, so 64 frames later
    every frame of the straggler read as late)."""
    w0, w1 = workers = _setup(target)
    tx, prev = 0, None
    for k in range(72):
        seq = 300 + k
        slot, shadow = k % SLOTS, k // SLOTS % 2  # each use of a slot in the other copy
        target.send(w1.port, counted(w1, slot, seq, tx=k, shadow=shadow))
        _quiet(target)
        lost = 1 if k in (1, 70) else 0  # worker 0's frame before this one is lost
        tx += lost
        target.send(w0.port, counted(w0, slot, seq, tx=tx, shadow=shadow))
        flags, reserved = (0, 0) if prev is None else (PREV_DONE, prev & 0x7F)
        _multicast(target, workers, slot, seq, flags=flags, reserved=reserved, shadow=shadow,
                   gap=(w0, 1, tx) if lost else None)
        prev, tx = seq, tx + 1
    regs = _registers(target)
    if regs is not None:
        assert (regs[0][JOB * 32], regs[0][JOB * 32 + 1]) == (held(74), held(72))


def test_a_new_generation_starts_the_counters_afresh(target):
    """The registers keep the generation of what they hold: after the job's generation changes (or its id is reused
    by a new job, which the controller gives a new generation), the first counted frame is in sequence whatever
    its counter, and the first completion names no previous one."""
    w0, w1 = workers = _setup(target)
    target.send(w0.port, counted(w0, 0, 10, tx=40))
    _quiet(target)
    target.send(w1.port, counted(w1, 0, 10, tx=100))
    _multicast(target, workers, 0, 10, flags=0, reserved=0)
    entries = job_entries(JOB, [WorkerAddress(w.wid, w.port, w.mac, w.ip, w.udp_port) for w in workers],
                          base_slot=BASE, num_slots=SLOTS, generation=GEN + 1)
    target.modify_entry(entries.job.table, entries.job.match, entries.job.action, entries.job.params)
    # counters 0 would be 88 ahead (late) and 28 ahead (a gap of 28) of what generation GEN left
    target.send(w0.port, counted(w0, 1, 11, tx=0, generation=GEN + 1))
    _quiet(target)
    target.send(w1.port, counted(w1, 1, 11, tx=0, generation=GEN + 1))
    _multicast(target, workers, 1, 11, flags=0, reserved=0, generation=GEN + 1)
    regs = _registers(target)
    if regs is not None:
        assert (regs[0][JOB * 32], regs[0][JOB * 32 + 1], regs[1][JOB]) == (held(1, GEN + 1), held(1, GEN + 1),
                                                                           held(11, GEN + 1))


def test_counter_and_previous_completion_wrap_at_128(target):
    w0, w1 = workers = _setup(target)
    for k, (seq, tx) in enumerate(((126, 125), (127, 126), (128, 127), (129, 0), (130, 1))):
        target.send(w0.port, counted(w0, k, seq, tx=tx))
        _quiet(target)
        target.send(w1.port, counted(w1, k, seq, tx=(tx - 10) % 128))  # 115 .. 119
        if k == 0:
            _multicast(target, workers, k, seq, flags=0, reserved=0)
        else:  # 126, 127, then 0 and 1 after the wrap: PREV_DONE tells reserved 0 from "none yet"
            _multicast(target, workers, k, seq, flags=PREV_DONE, reserved=(seq - 1) & 0x7F)
    # worker 1 expects 120 next: tx 5 reports the 13 frames 120 .. 127, 0 .. 4 lost (the difference mod 128)
    target.send(w1.port, counted(w1, 5, 131, tx=5))
    assert _one(target, w1.port) == _gap_report(w1, 131, tx=5, lost=13)
    # worker 0 expects 2 (127 + 1 wrapped, plus 2), worker 1 expects 6
    target.send(w1.port, counted(w1, 6, 132, tx=6))
    _quiet(target)
    target.send(w1.port, counted(w1, 7, 133, tx=7))
    _quiet(target)
    target.send(w0.port, counted(w0, 6, 132, tx=2))
    _multicast(target, workers, 6, 132, flags=PREV_DONE, reserved=130 & 0x7F)
    target.send(w0.port, counted(w0, 7, 133, tx=5))  # 3 and 4 lost: it completes, its copy reports them
    _multicast(target, workers, 7, 133, flags=PREV_DONE, reserved=132 & 0x7F, gap=(w0, 2, 5))
    target.send(w0.port, counted(w0, 0, 134, tx=6))  # dropped, in sequence: no report
    _quiet(target)


def test_late_frames_give_no_report_and_leave_the_counter(target):
    """A counted frame behind the counter expected next (reordered by the network, or a duplicate) is a late frame:
    no gap report, ina_tx_next unchanged, otherwise exactly the in-sequence frame's fate and bytes (a completion
    multicast with PREV_DONE, an answer with reserved 0, a drop)."""
    w0, w1 = workers = _setup(target)
    target.send(w0.port, counted(w0, 0, 10, tx=0))
    _quiet(target)
    target.send(w1.port, counted(w1, 0, 10, tx=0))
    _multicast(target, workers, 0, 10, flags=0, reserved=0)
    target.send(w1.port, counted(w1, 1, 11, tx=1))
    _quiet(target)
    # worker 0's tx 1 (chunk 11) is delayed: tx 2 overtakes it and reports it (slot 2 waits for worker 1)
    target.send(w0.port, counted(w0, 2, 12, tx=2))
    assert _one(target, w0.port) == _gap_report(w0, 12, tx=2, lost=1)
    regs = _registers(target)
    if regs is not None:
        assert regs[0][JOB * 32] == held(3)
    # the late tx 1 ((1 - 3) mod 128 = 126 ahead: behind) completes slot 1: the result as in sequence, no report
    target.send(w0.port, counted(w0, 1, 11, tx=1))
    _multicast(target, workers, 1, 11, flags=PREV_DONE, reserved=10)
    # the network duplicates it: the answer to the sender alone (reserved 0), as a resend in sequence gets
    target.send(w0.port, counted(w0, 1, 11, tx=1))
    assert _one(target, w0.port) == _result(w0, 1, 11, _sum(workers, 11), flags=0, reserved=0)
    # and duplicates tx 2 (127 ahead), whose copy waits: dropped, not "127 frames lost"
    target.send(w0.port, counted(w0, 2, 12, tx=2))
    _quiet(target)
    if regs is not None:
        assert (regs[0][JOB * 32], regs[1][JOB]) == (held(3), held(11))
    # the counter still expects 3: the next frame in sequence passes with no report, and the next gap counts from it
    target.send(w0.port, counted(w0, 3, 13, tx=3))
    _quiet(target)
    target.send(w0.port, counted(w0, 4, 14, tx=5))
    assert _one(target, w0.port) == _gap_report(w0, 14, tx=5, lost=1)
    assert target.read_counter("MyIngress.ina_duplicates", JOB) == 2
    assert target.read_counter("MyIngress.ina_aggregated", JOB) == 7
    assert target.read_counter("MyEgress.ina_results", JOB) == 5
    # worker 1 completes slots 2-4: each late or reported frame of worker 0 was added once
    for slot, seq in ((2, 12), (3, 13), (4, 14)):
        target.send(w1.port, counted(w1, slot, seq, tx=slot))
        _multicast(target, workers, slot, seq, flags=PREV_DONE, reserved=(11, 12, 13)[slot - 2])


def test_half_the_counter_space_tells_a_gap_from_a_late_frame(target):
    """(tx - expected) mod 128: 1 .. 63 is a gap of that many frames, 64 .. 127 a late frame (behind)."""
    w0, w1 = workers = _setup(target)
    assert wire.TX_LATE_HALF == 64
    target.send(w0.port, counted(w0, 0, 20, tx=0))
    _quiet(target)
    target.send(w0.port, counted(w0, 1, 21, tx=64))  # 63 ahead of 1: the largest gap
    assert _one(target, w0.port) == _gap_report(w0, 21, tx=64, lost=63)
    target.send(w0.port, counted(w0, 2, 22, tx=1))  # 64 ahead of 65: late
    _quiet(target)
    target.send(w0.port, counted(w0, 3, 23, tx=66))  # 1 ahead of 65: a gap (the late frame did not move it)
    assert _one(target, w0.port) == _gap_report(w0, 23, tx=66, lost=1)
    target.send(w0.port, counted(w0, 4, 24, tx=67))
    _quiet(target)
    regs = _registers(target)
    if regs is not None:
        assert regs[0][JOB * 32] == held(68)
    for k in range(5):  # every frame was added once, the late one included
        target.send(w1.port, counted(w1, k, 20 + k, tx=k))
        _multicast(target, workers, k, 20 + k, flags=PREV_DONE if k else 0, reserved=(19 + k) & 0x7F if k else 0)


def test_uncounted_frames_keep_todays_bytes_and_state(target):
    """Without TX_COUNTED the result carries the completing frame's reserved, no report, no register changes."""
    w0, w1 = workers = _setup(target)
    before = _registers(target)
    before = None if before is None else (list(before[0]), list(before[1]))
    target.send(w0.port, gradient(w0, JOB, 0, _lanes(w0, 50), seq=50, generation=GEN, reserved=9))
    target.send(w0.port, gradient(w0, JOB, 1, _lanes(w0, 51), seq=51, generation=GEN, reserved=77))  # a "gap"
    _quiet(target)
    target.send(w1.port, gradient(w1, JOB, 0, _lanes(w1, 50), seq=50, generation=GEN, reserved=33))
    _multicast(target, workers, 0, 50, flags=0, reserved=33)
    target.send(w0.port, gradient(w0, JOB, 0, _lanes(w0, 50), seq=50, generation=GEN, reserved=5,
                                  flags=wire.Flags.RETRANSMIT))
    assert _one(target, w0.port) == _result(w0, 0, 50, _sum(workers, 50), flags=0, reserved=5)
    after = _registers(target)
    if after is not None:
        assert (list(after[0]), list(after[1])) == before
    # a counted broadcast and query are as without the flag: the broadcast's bytes as they came, the query's status
    bcast = bytearray(gradient(w0, JOB, 0, _lanes(w0, 1), seq=1, generation=GEN, msg_type=wire.MsgType.BROADCAST,
                               flags=COUNTED, reserved=100))
    target.send(w0.port, bytes(bcast))
    out = target.receive(expect=2)
    assert sorted(p for p, _ in out) == [1, 2]
    for _, f in out:
        ina = dissect(f)[INA]
        assert (int(ina.flags), ina.reserved, ina.msg_type) == (COUNTED, 100, wire.MsgType.BROADCAST)
    q = wire.InaHeader(wire.MsgType.QUERY, COUNTED, JOB, GEN, 3, 60, w0.wid, 0, 100)
    target.send(w0.port, raw(Ether(src=w0.mac, dst=SWITCH_MAC) / IP(src=w0.ip, dst=SWITCH_IP)
                             / UDP(sport=w0.udp_port, dport=wire.INA_UDP_PORT) / Raw(wire.pack_header(q))))
    status = dissect(_one(target, w0.port))[INA]
    assert (status.msg_type, int(status.flags), status.reserved) == (wire.MsgType.STATUS, 0, 100)
    after = _registers(target)
    if after is not None:
        assert (list(after[0]), list(after[1])) == before


def test_foreign_spoofed_and_stale_counted_frames_change_no_state(target):
    w0, w1 = workers = _setup(target)
    target.send(w0.port, counted(w0, 0, 70, tx=10))
    _quiet(target)
    before = register_state(target)
    stranger = make_workers(4)[3]  # not a member
    target.send(stranger.port, counted(stranger, 1, 71, tx=50))
    spoofed = counted(Worker(0, 2), 1, 71, tx=50)  # worker 0's frame on worker 1's port
    target.send(2, spoofed)
    target.send(w0.port, counted(w0, 1, 71, tx=50, generation=GEN + 1))  # stale generation
    target.send(w0.port, counted(w0, SLOTS, 71, tx=50))  # slot out of range
    target.send(w0.port, counted(w0, 1, 71, tx=50, job=JOB + 1))  # unknown job
    bad = bytearray(counted(w0, 1, 71, tx=50))
    bad[wire.ETH_LEN + 10] ^= 0xFF  # IPv4 checksum
    target.send(w0.port, bytes(bad))
    _quiet(target)
    assert_same_registers(before, register_state(target))
    drops = {r: target.read_counter("MyIngress.ina_drops", r) for r in wire.DropReason}
    assert drops[wire.DropReason.FOREIGN_WORKER] == 1 and drops[wire.DropReason.SPOOFED] == 1
    assert drops[wire.DropReason.STALE_GENERATION] == 1 and drops[wire.DropReason.SLOT_OUT_OF_RANGE] == 1
    assert drops[wire.DropReason.UNKNOWN_JOB] == 1 and drops[wire.DropReason.MALFORMED] == 1
    # worker 0's counter still expects 11: its next frame is no gap
    target.send(w0.port, counted(w0, 1, 71, tx=11))
    _quiet(target)
    target.send(w1.port, counted(w1, 0, 70, tx=0))
    _multicast(target, workers, 0, 70, flags=0, reserved=0)


def test_chain_jobs_ignore_the_flag(switches):
    """A job on chains: counted frames with counters that would be gaps give no report and no PREV_DONE; the
    results carry the completing frame's reserved, as without the flag."""
    fabric, workers_at = two_switches(switches)
    for rnd, tx in enumerate((5, 9, 40)):
        seq, shadow = 1 + rnd, rnd % 2
        total = np.zeros(wire.LANES, np.int64)
        for s, ws in workers_at.items():
            for w in ws:
                v = np.full(wire.LANES, w.wid + rnd, np.int64)
                total += v
                fabric.send(s, w.port, gradient(w, CHAIN_JOB, 1, v, seq=seq, shadow=shadow, flags=COUNTED, reserved=tx))
        delivered = fabric.run()
        got = [p for pkts in delivered.values() for p in pkts]
        assert len(got) == 4
        for pkt in got:
            ina = pkt[INA]
            assert (ina.msg_type, int(ina.flags), ina.reserved, ina.seq) == (wire.MsgType.RESULT, 0, tx, seq)
            assert ina.lanes == [int(v) for v in total]
    for t in fabric.switches:
        regs = _registers(t)
        if regs is not None:
            assert not any(regs[0]) and not any(regs[1])
