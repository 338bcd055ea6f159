"""Queries (docs/protocol.md, "Queries"): a worker asks whether its contribution is in a slot copy before
resending the payload. Exact bytes out; a query never changes state."""
from __future__ import annotations

from scapy.all import IP, UDP, Ether, Raw, raw

from inaproto import wire
from inaproto.scapy_layer import INA
from tests.support.entries import install_job
from tests.support.frames import SWITCH_IP, SWITCH_MAC, dissect, gradient, make_workers
from tests.targets import assert_same_registers, register_state

JOB, GEN = 3, 2


def query(worker, slot: int, seq: int, shadow: int = 0, job_id: int = JOB, generation: int = GEN) -> bytes:
    """A worker's header-only query frame (56 bytes)."""
    h = wire.InaHeader(wire.MsgType.QUERY, 0, job_id, generation, slot, seq, worker.wid, shadow)
    return raw(Ether(src=worker.mac, dst=SWITCH_MAC) / IP(src=worker.ip, dst=SWITCH_IP)
               / UDP(sport=worker.udp_port, dport=wire.INA_UDP_PORT) / Raw(wire.pack_header(h)))


def _setup(target, contributed: int):
    """Job 3, three workers on ports 1-3, slots 20..23; the first ``contributed`` workers sent chunk 9 to slot 1."""
    workers = make_workers(3)
    install_job(target, JOB, workers, base=20, num_slots=4, generation=GEN)
    for w in workers[:contributed]:
        target.send(w.port, gradient(w, JOB, 1, [w.wid + 1] * wire.LANES, seq=9, shadow=1, generation=GEN))
    return workers


def _status_frame(worker, seq: int, flags: int) -> bytes:
    """The exact frame the switch answers a query of ``worker`` for (slot 1, chunk ``seq``, copy 1) with."""
    h = wire.InaHeader(wire.MsgType.STATUS, flags, JOB, GEN, 1, seq, worker.wid, 1)
    pkt = (Ether(src=SWITCH_MAC, dst=worker.mac) / IP(src=SWITCH_IP, dst=worker.ip)
           / UDP(sport=wire.INA_UDP_PORT, dport=worker.udp_port, chksum=0) / Raw(wire.pack_header(h)))
    return raw(pkt)


def _same_ip_fields(got: bytes, want: bytes) -> None:
    """Equal frames up to the IPv4 identification/ttl/tos the sender chose (both built by scapy here)."""
    assert dissect(got)[IP].chksum == IP(raw(dissect(got)[IP])).chksum  # a valid checksum
    assert got == want


def test_query_of_contribution_in_incomplete_copy_answers_held(target):
    workers = _setup(target, 2)
    assert target.receive(expect=0, timeout=0.05) == []
    before = register_state(target)
    target.send(2, query(workers[1], 1, 9, shadow=1))
    out = target.receive(expect=1)
    assert [p for p, _ in out] == [2]
    _same_ip_fields(out[0][1], _status_frame(workers[1], 9, wire.Flags.HELD))
    assert_same_registers(before, register_state(target))
    assert target.read_counter("MyIngress.ina_duplicates", JOB) == 0
    # the slot still completes exactly with the third worker's gradient
    target.send(3, gradient(workers[2], JOB, 1, [3] * wire.LANES, seq=9, shadow=1, generation=GEN))
    res = target.receive(expect=3)
    assert sorted(p for p, _ in res) == [1, 2, 3]
    assert all(dissect(f)[INA].lanes == [6] * wire.LANES for _, f in res)


def test_query_without_contribution_answers_not_held(target):
    workers = _setup(target, 2)
    assert target.receive(expect=0, timeout=0.05) == []
    before = register_state(target)
    target.send(3, query(workers[2], 1, 9, shadow=1))  # its gradient was lost
    out = target.receive(expect=1)
    assert [p for p, _ in out] == [3]
    _same_ip_fields(out[0][1], _status_frame(workers[2], 9, 0))
    target.send(1, query(workers[0], 1, 10, shadow=1))  # a chunk the copy does not hold
    out = target.receive(expect=1)
    assert [p for p, _ in out] == [1]
    _same_ip_fields(out[0][1], _status_frame(workers[0], 10, 0))
    assert_same_registers(before, register_state(target))
    target.send(3, gradient(workers[2], JOB, 1, [3] * wire.LANES, seq=9, shadow=1, generation=GEN))
    res = target.receive(expect=3)
    assert all(dissect(f)[INA].lanes == [6] * wire.LANES for _, f in res)


def test_query_of_unused_slot_answers_not_held_and_changes_nothing(target):
    workers = _setup(target, 0)
    before = register_state(target)
    target.send(1, query(workers[0], 1, 9, shadow=1))
    out = target.receive(expect=1)
    _same_ip_fields(out[0][1], _status_frame(workers[0], 9, 0))
    assert_same_registers(before, register_state(target))


def test_query_of_complete_copy_answers_the_sum_to_sender_only(target):
    workers = _setup(target, 3)
    assert len(target.receive(expect=3)) == 3
    target.send(2, query(workers[1], 1, 9, shadow=1))  # its result was lost
    out = target.receive(expect=1)
    assert [p for p, _ in out] == [2]
    pkt = dissect(out[0][1])
    ina = pkt[INA]
    assert ina.msg_type == wire.MsgType.RESULT and int(ina.flags) == 0
    assert (ina.job_id, ina.generation, ina.slot, ina.seq, ina.shadow, ina.worker_id) == (JOB, GEN, 1, 9, 1, 1)
    assert ina.lanes == [6] * wire.LANES
    assert pkt.dst == workers[1].mac and pkt.src == SWITCH_MAC
    assert pkt[IP].dst == workers[1].ip and pkt[IP].src == SWITCH_IP
    assert pkt[UDP].dport == workers[1].udp_port and pkt[UDP].sport == wire.INA_UDP_PORT and pkt[UDP].chksum == 0
    assert pkt[IP].len == wire.INA_IPV4_LEN and pkt[UDP].len == wire.INA_UDP_LEN
    assert len(out[0][1]) == wire.INA_FRAME_LEN
    assert pkt[IP].chksum == IP(raw(pkt[IP])).chksum
    assert target.read_counter("MyEgress.ina_results", JOB) == 4


def test_foreign_and_malformed_queries_dropped(target):
    workers = _setup(target, 2)
    assert target.receive(expect=0, timeout=0.05) == []
    before = register_state(target)
    stranger = make_workers(5)[4]
    target.send(stranger.port, query(stranger, 1, 9, shadow=1))  # not a member
    q = Ether(query(workers[0], 1, 9, shadow=1))
    q[IP].len = wire.INA_IPV4_LEN  # a gradient's length on a header-only query
    del q[IP].chksum
    target.send(1, raw(q))
    with_lanes = bytearray(gradient(workers[0], JOB, 1, [1] * wire.LANES, seq=9, shadow=1, generation=GEN))
    with_lanes[wire.INA_OFFSET] = wire.MsgType.QUERY  # a query carrying lanes
    target.send(1, bytes(with_lanes))
    target.send(1, query(workers[0], 7, 9, shadow=1))  # slot out of the job's range
    assert target.receive(expect=0, timeout=0.05) == []
    assert_same_registers(before, register_state(target))
    assert target.read_counter("MyIngress.ina_drops", wire.DropReason.MALFORMED) == 2
    assert target.read_counter("MyIngress.ina_drops", wire.DropReason.SLOT_OUT_OF_RANGE) == 1
