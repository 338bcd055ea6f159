"""Bad input never changes aggregator state: it is dropped and counted by reason."""
from __future__ import annotations

import random

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw, raw

from inaproto import wire
from inaproto.scapy_layer import INA
from inaproto.wire import DropReason
from tests.support.entries import install_job
from tests.support.frames import SWITCH_IP, SWITCH_MAC, dissect, gradient, make_workers
from tests.targets import assert_same_registers, register_state


@pytest.fixture
def job(target):
    """Job 2, three workers on ports 1-3, slots 10..13, generation 4; worker 0 has contributed to slot 0."""
    workers = make_workers(3)
    install_job(target, 2, workers, base=10, num_slots=4, generation=4)
    target.send(1, gradient(workers[0], 2, 0, [1] * wire.LANES, generation=4))
    assert target.receive(expect=0, timeout=0.05) == []
    return workers


def _finish_slot(target, workers):
    """Behavioural check that works on every target: the slot still sums to exactly 1 + 2 + 3."""
    target.send(2, gradient(workers[1], 2, 0, [2] * wire.LANES, generation=4))
    target.send(3, gradient(workers[2], 2, 0, [3] * wire.LANES, generation=4))
    out = target.receive(expect=3)
    assert len(out) == 3
    assert all(dissect(f)[INA].lanes == [6] * wire.LANES for _, f in out)


BAD = {
    "unknown job": (lambda w: gradient(w[1], 99, 0, [5] * wire.LANES, generation=4), DropReason.UNKNOWN_JOB, False),
    "slot beyond range": (lambda w: gradient(w[1], 2, 4, [5] * wire.LANES, generation=4), DropReason.SLOT_OUT_OF_RANGE, True),
    "slot far beyond pool": (lambda w: gradient(w[1], 2, 65535, [5] * wire.LANES, generation=4), DropReason.SLOT_OUT_OF_RANGE, True),
    "foreign worker": (
        lambda w: gradient(make_workers(8)[7], 2, 0, [5] * wire.LANES, generation=4), DropReason.FOREIGN_WORKER, True,
    ),
    "worker id beyond bitmap": (
        lambda w: gradient(make_workers(40)[39], 2, 0, [5] * wire.LANES, generation=4), DropReason.FOREIGN_WORKER, True,
    ),
    "stale generation": (lambda w: gradient(w[1], 2, 0, [5] * wire.LANES, generation=3), DropReason.STALE_GENERATION, True),
    "result from a worker": (
        lambda w: gradient(w[1], 2, 0, [5] * wire.LANES, generation=4, msg_type=wire.MsgType.RESULT), DropReason.BAD_MSG_TYPE, True,
    ),
    "message type 0": (lambda w: gradient(w[1], 2, 0, [5] * wire.LANES, generation=4, msg_type=0), DropReason.BAD_MSG_TYPE, True),
}


@pytest.mark.parametrize("case", BAD)
def test_invalid_ina_packets_dropped_counted_no_state_change(target, job, case):
    build, reason, per_job = BAD[case]
    before = register_state(target)
    target.send(2, build(job))
    assert target.receive(expect=0, timeout=0.05) == []
    assert_same_registers(before, register_state(target))
    assert target.read_counter("MyIngress.ina_drops", reason) == 1
    if per_job:
        assert target.read_counter("MyIngress.ina_job_drops", 2 * wire.NUM_DROP_REASONS + reason) == 1
    _finish_slot(target, job)


def _valid(job) -> bytes:
    return gradient(job[1], 2, 0, [5] * wire.LANES, generation=4)


def _with_ip(frame: bytes, **fields) -> bytes:
    pkt = Ether(frame)
    for k, v in fields.items():
        setattr(pkt[IP], k, v)
    del pkt[IP].chksum
    return raw(pkt)


MALFORMED = {
    "truncated in ethernet": lambda j: _valid(j)[:10],
    "truncated in ipv4": lambda j: _valid(j)[:30],
    "truncated in udp": lambda j: _valid(j)[:38],
    "truncated in ina header": lambda j: _valid(j)[:50],
    "truncated in lanes": lambda j: _valid(j)[:-4],
    "one lane short, lengths consistent": lambda j: raw(
        Ether(src=j[1].mac, dst=SWITCH_MAC) / IP(src=j[1].ip, dst=SWITCH_IP) / UDP(sport=1, dport=wire.INA_UDP_PORT)
        / Raw(_valid(j)[wire.INA_OFFSET:-4])
    ),
    "64 lanes": lambda j: raw(
        Ether(src=j[1].mac, dst=SWITCH_MAC) / IP(src=j[1].ip, dst=SWITCH_IP) / UDP(sport=1, dport=wire.INA_UDP_PORT)
        / Raw(_valid(j)[wire.INA_OFFSET:] + bytes(128))
    ),
    "bad ipv4 total length": lambda j: _with_ip(_valid(j), len=wire.INA_IPV4_LEN + 4),
    "bad udp length": lambda j: _valid(j)[:38] + b"\x00\x10" + _valid(j)[40:],
    "bad ipv4 checksum": lambda j: _valid(j)[:24] + bytes([_valid(j)[24] ^ 0xFF]) + _valid(j)[25:],
    "ipv4 options": lambda j: raw(
        Ether(src=j[1].mac, dst=SWITCH_MAC) / IP(src=j[1].ip, dst=SWITCH_IP, options=b"\x01\x01\x01\x00")
        / UDP(sport=1, dport=wire.INA_UDP_PORT) / Raw(_valid(j)[wire.INA_OFFSET:])
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_frames_dropped_no_state_change(target, job, case):
    before = register_state(target)
    target.send(2, MALFORMED[case](job))
    assert target.receive(expect=0, timeout=0.05) == []
    assert_same_registers(before, register_state(target))
    _finish_slot(target, job)


def test_random_bytes_never_changeregister_state(target, job):
    rng = random.Random(3)
    before = register_state(target)
    valid = _valid(job)
    for _ in range(300):
        n = rng.randrange(0, 200)
        if rng.random() < 0.5:
            frame = bytes(rng.randrange(256) for _ in range(n))
        else:  # a valid frame with random bytes flipped somewhere in its headers
            frame = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(0, wire.INA_OFFSET + wire.INA_HEADER_LEN)] ^= 1 << rng.randrange(8)
            frame = bytes(frame)
            if Ether(frame).haslayer(INA) and dissect(frame)[IP].chksum == dissect(valid)[IP].chksum:
                continue  # the flip left the IPv4 header intact: possibly a valid packet
        target.send(2, frame)
    target.receive(expect=None, timeout=0.2)
    assert_same_registers(before, register_state(target))
    _finish_slot(target, job)


def test_non_ina_ipv4_forwarded_by_lpm(target):
    target.insert_entry("MyIngress.ipv4_lpm", ((0x0A000200, 24),), "MyIngress.ipv4_forward", (0x020000000002, 2))
    target.insert_entry("MyIngress.ipv4_lpm", ((0x0A000202, 32),), "MyIngress.ipv4_forward", (0x020000000003, 3))
    frame = raw(Ether(src="02:00:00:00:00:01", dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="10.0.2.9", ttl=9)
                / TCP(sport=5000, dport=6000) / Raw(b"ring traffic"))
    target.send(1, frame)
    out = target.receive(expect=1)
    assert [p for p, _ in out] == [2]
    pkt = dissect(out[0][1])
    assert pkt.dst == "02:00:00:00:00:02" and pkt.src == SWITCH_MAC
    assert pkt[IP].ttl == 8 and pkt[TCP].payload.load == b"ring traffic"
    expected = Ether(frame)
    expected.dst, expected.src, expected[IP].ttl = "02:00:00:00:00:02", SWITCH_MAC, 8
    del expected[IP].chksum
    assert out[0][1] == raw(expected)  # exact bytes: only MACs, TTL and the IPv4 checksum change
    # longest prefix wins
    target.send(1, raw(Ether(dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="10.0.2.2") / UDP(sport=1, dport=2)))
    assert [p for p, _ in target.receive(expect=1)] == [3]


def test_udp_to_other_ports_is_plain_ipv4(target):
    target.insert_entry("MyIngress.ipv4_lpm", ((0x0A000000, 8),), "MyIngress.ipv4_forward", (0x020000000009, 4))
    frame = raw(Ether(dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="10.0.2.2") / UDP(sport=wire.INA_UDP_PORT, dport=9) / Raw(bytes(142)))
    target.send(1, frame)
    assert [p for p, _ in target.receive(expect=1)] == [4]


def test_no_route_dropped_and_counted(target):
    target.send(1, raw(Ether(dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="192.0.2.1") / UDP(sport=1, dport=2)))
    assert target.receive(expect=0, timeout=0.05) == []
    assert target.read_counter("MyIngress.ina_drops", DropReason.NO_ROUTE) == 1


def test_non_ipv4_dropped(target):
    target.send(1, raw(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="10.0.0.254")))
    assert target.receive(expect=0, timeout=0.05) == []


def test_job_ids_beyond_the_counters_are_unknown_even_with_an_entry(target):
    """ina_job is keyed on 16 bits but the per-job counters have MAX_JOBS cells: ids beyond never aggregate."""
    workers = make_workers(2)
    install_job(target, 300, workers, base=0, num_slots=4, mcast_grp=7)
    target.send(1, gradient(workers[0], 300, 0, [1] * wire.LANES))
    target.send(2, gradient(workers[1], 300, 0, [1] * wire.LANES))
    assert target.receive(expect=0, timeout=0.05) == []
    assert target.read_counter("MyIngress.ina_drops", DropReason.UNKNOWN_JOB) == 2
    install_job(target, 5, workers, base=0, num_slots=4)  # and the switch keeps working
    target.send(1, gradient(workers[0], 5, 0, [1] * wire.LANES))
    target.send(2, gradient(workers[1], 5, 0, [1] * wire.LANES))
    assert len(target.receive(expect=2)) == 2


def test_ipv4_checksum_is_compared_exactly(target):
    """BMv2 computes csum16 over the other fields and compares: 0xFFFF is not accepted for 0x0000."""
    target.insert_entry("MyIngress.ipv4_lpm", ((0x0A000000, 8),), "MyIngress.ipv4_forward", (0x020000000009, 4))
    # A header whose correct checksum is 0x0000: the checksum with id 0 is c, so id c adds exactly what makes the
    # one's-complement sum 0xFFFF.
    def header(ident: int):
        return Ether(dst=SWITCH_MAC) / IP(src="10.0.1.1", dst="10.0.2.2", id=ident) / UDP(sport=1, dport=2)

    pkt = header(Ether(raw(header(0)))[IP].chksum)
    assert Ether(raw(pkt))[IP].chksum == 0
    good = raw(pkt)
    bad = good[:24] + b"\xff\xff" + good[26:]  # the same one's-complement sum, but not what csum16 gives
    target.send(1, good)
    assert [p for p, _ in target.receive(expect=1)] == [4]
    target.send(1, bad)
    assert target.receive(expect=0, timeout=0.05) == []
    assert target.read_counter("MyIngress.ina_drops", DropReason.MALFORMED) == 1
