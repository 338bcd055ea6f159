"""Ingress binding: a worker's gradients and broadcasts count only from the switch port, source MAC, IPv4
address and UDP port bound to (job, worker); anything else is dropped as SPOOFED, globally and per job."""
from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from inaproto import wire
from inaproto.job_entries import WorkerAddress, job_entries
from inaproto.scapy_layer import INA
from inaproto.wire import DropReason
from tests.support.entries import install_job
from tests.support.frames import Worker, dissect, gradient, make_workers

JOB = 6
SPOOFED = DropReason.SPOOFED


@pytest.fixture
def job(target):
    """Job 6: three workers on ports 1-3, slots 20..23, generation 2."""
    workers = make_workers(3)
    install_job(target, JOB, workers, base=20, num_slots=4, generation=2)
    return workers


def _spoofed(target) -> tuple[int, int]:
    return (target.read_counter("MyIngress.ina_drops", SPOOFED),
            target.read_counter("MyIngress.ina_job_drops", JOB * wire.NUM_DROP_REASONS + SPOOFED))


def _complete(target, workers, slot: int, values: list[int], seq: int = 0) -> list[tuple[int, bytes]]:
    """Every worker sends ``values[i]`` on every lane of ``slot`` from its own port; returns the results."""
    out = []
    for i, w in enumerate(workers):
        target.send(w.port, gradient(w, JOB, slot, [values[i]] * wire.LANES, seq=seq, generation=2))
        out = target.receive(expect=len(workers) if i == len(workers) - 1 else 0,
                             timeout=2.0 if i == len(workers) - 1 else 0.05)
    return out


@dataclass(frozen=True)
class Forged:
    """A worker's identity with some of its sending address replaced."""

    wid: int
    port: int
    mac: str
    ip: str
    udp_port: int


def _forge(w: Worker, **changes) -> Forged:
    return replace(Forged(w.wid, w.port, w.mac, w.ip, w.udp_port), **changes)


FORGERIES = {
    "another worker's port": {"port": 1},  # worker 1's id and addresses, arriving on worker 0's port
    "an unbound port": {"port": 9},
    "wrong source MAC": {"mac": "02:00:00:00:00:99"},
    "wrong source IPv4": {"ip": "10.0.9.9"},
    "wrong source UDP port": {"udp_port": 41999},
    "another worker's MAC": {"mac": make_workers(1)[0].mac},
}


@pytest.mark.parametrize("case", FORGERIES)
@pytest.mark.parametrize("msg_type", [wire.MsgType.GRADIENT, wire.MsgType.BROADCAST])
def test_forged_sender_dropped_counted_and_harmless(target, job, case, msg_type):
    """Worker 1's id from anywhere but its bound port and addresses: nothing out, SPOOFED counted, and the
    slot then sums exactly the three real contributions."""
    forged = _forge(job[1], **FORGERIES[case])
    target.send(forged.port, gradient(forged, JOB, 0, [1000] * wire.LANES, generation=2, msg_type=msg_type))
    assert target.receive(expect=0, timeout=0.05) == []
    assert _spoofed(target) == (1, 1)
    assert target.read_counter("MyIngress.ina_aggregated", JOB) == 0
    out = _complete(target, job, 0, [1, 2, 3])
    assert sorted(p for p, _ in out) == [1, 2, 3]
    assert all(dissect(f)[INA].lanes == [6] * wire.LANES for _, f in out)
    assert target.read_counter("MyIngress.ina_aggregated", JOB) == 3


def test_spoofing_cannot_complete_or_poison_a_slot(target, job):
    """Workers 0 and 1 contributed; a forged copy of worker 2 from worker 0's port neither completes the slot
    nor changes its sum: the real worker 2 then gets exactly 1 + 2 + 3 to everyone."""
    target.send(1, gradient(job[0], JOB, 1, [1] * wire.LANES, generation=2))
    target.send(2, gradient(job[1], JOB, 1, [2] * wire.LANES, generation=2))
    target.send(1, gradient(_forge(job[2], port=1), JOB, 1, [500] * wire.LANES, generation=2))
    assert target.receive(expect=0, timeout=0.05) == []
    assert _spoofed(target) == (1, 1)
    target.send(3, gradient(job[2], JOB, 1, [3] * wire.LANES, generation=2))
    out = target.receive(expect=3)
    assert sorted(p for p, _ in out) == [1, 2, 3]
    assert all(dissect(f)[INA].lanes == [6] * wire.LANES for _, f in out)


def test_forged_retransmission_gets_no_result(target, job):
    """A completed slot answers a retransmission only to its bound sender: a forged one gets nothing back."""
    _complete(target, job, 2, [4, 5, 6])
    target.send(5, gradient(_forge(job[0], port=5), JOB, 2, [4] * wire.LANES, generation=2))
    assert target.receive(expect=0, timeout=0.05) == []
    assert _spoofed(target) == (1, 1)
    target.send(1, gradient(job[0], JOB, 2, [4] * wire.LANES, generation=2))
    (port, frame), = target.receive(expect=1)
    assert port == 1 and dissect(frame)[INA].lanes == [15] * wire.LANES


def test_two_workers_on_one_host(target):
    """Workers 0 and 1 share a host (port 4, one MAC and IPv4 address) with distinct UDP ports: both are
    aggregated, each result goes to its own UDP port, and neither can speak for the other."""
    host = make_workers(1)[0]
    addrs = [WorkerAddress(i, 4, host.mac, host.ip, 45000 + i) for i in range(2)] + \
        [WorkerAddress(2, 5, make_workers(3)[2].mac, make_workers(3)[2].ip, 45002)]
    job_entries(JOB, addrs, base_slot=0, num_slots=2, generation=2).insert_into(target)
    senders = [Forged(a.worker_id, a.port, a.mac, a.ip, a.udp_port) for a in addrs]

    # worker 0's id from worker 1's UDP port on the same host: spoofed
    target.send(4, gradient(_forge(senders[0], udp_port=45001), JOB, 0, [7] * wire.LANES, generation=2))
    assert target.receive(expect=0, timeout=0.05) == []
    assert _spoofed(target) == (1, 1)

    for i, s in enumerate(senders):
        target.send(s.port, gradient(s, JOB, 0, [i + 1] * wire.LANES, generation=2))
    out = target.receive(expect=3)
    got = {(port, dissect(f)["UDP"].dport, dissect(f)[INA].worker_id): dissect(f)[INA].lanes for port, f in out}
    assert got == {(4, 45000, 0): [6] * wire.LANES, (4, 45001, 1): [6] * wire.LANES, (5, 45002, 2): [6] * wire.LANES}
    for port, f in out:
        pkt = dissect(f)
        assert pkt.dst == addrs[pkt[INA].worker_id].mac and pkt["IP"].dst == addrs[pkt[INA].worker_id].ip
    assert target.read_counter("MyIngress.ina_aggregated", JOB) == 3


def test_binding_follows_a_modified_entry(target, job):
    """The controller moves worker 0 to port 7 (a modified ina_binding entry): port 7 counts, port 1 no longer."""
    moved = job_entries(JOB, [WorkerAddress(0, 7, job[0].mac, job[0].ip, job[0].udp_port)], base_slot=20, num_slots=4,
                        generation=2).bindings[0]
    target.modify_entry(moved.table, moved.match, moved.action, moved.params)
    target.send(1, gradient(job[0], JOB, 3, [1] * wire.LANES, generation=2))
    assert target.receive(expect=0, timeout=0.05) == []
    assert _spoofed(target) == (1, 1)
    target.send(7, gradient(job[0], JOB, 3, [1] * wire.LANES, generation=2))
    target.send(2, gradient(job[1], JOB, 3, [2] * wire.LANES, generation=2))
    target.send(3, gradient(job[2], JOB, 3, [3] * wire.LANES, generation=2))
    out = target.receive(expect=3)
    assert sorted(p for p, _ in out) == [1, 2, 3]  # results still go to the multicast group's ports
    assert all(dissect(f)[INA].lanes == [6] * wire.LANES for _, f in out)
